// The comparison helper the kernel tests report through (tests/test_util.h): a wrong change must
// print a few lines that say what is wrong, not one failure per element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/test_util.h"

using nanovllm::test::all_near;
using nanovllm::test::MismatchSummary;

TEST(Book_TestUtil, ThousandsOfMismatchesGiveOneShortReport) {
  MismatchSummary summary("elements");
  for (int i = 0; i < 10000; i++)
    summary.check(i == 4321 ? 7.5 : 1.0, 0.5, [&] { return "element " + std::to_string(i); });
  const ::testing::AssertionResult r = summary.result();
  ASSERT_FALSE(r);
  const std::string message = r.message();
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 1) << message;  // two lines in all
  EXPECT_NE(message.find("10000 of 10000 elements over the limit 0.5"), std::string::npos) << message;
  EXPECT_NE(message.find("worst: element 4321 (7.5)"), std::string::npos) << message;
  EXPECT_NE(message.find("first: element 0 (1); element 1 (1); element 2 (1); element 3 (1); element 4 (1)"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("element 5 "), std::string::npos) << "only the first five are listed: " << message;
}

TEST(Book_TestUtil, NanFailsAndIsTheWorst) {
  MismatchSummary summary("rows");
  summary.check(0.0, 1e-5, [] { return std::string("row 0"); });
  summary.check(0.1, 1e-5, [] { return std::string("row 1"); });
  summary.check(std::nan(""), 1e-5, [] { return std::string("row 2"); });
  summary.check(5.0, 1e-5, [] { return std::string("row 3"); });
  EXPECT_EQ(summary.failures(), 3);
  const std::string message = summary.result().message();
  EXPECT_NE(message.find("3 of 4 rows"), std::string::npos) << message;
  EXPECT_NE(message.find("worst: row 2 (nan)"), std::string::npos) << message;
}

TEST(Book_TestUtil, AllNearPassesWithinToleranceAndNamesTheElement) {
  const std::vector<float> want = {1, 2, 3, 4};
  const std::vector<float> close = {1.0f, 2.0f + 1e-7f, 3.0f, 4.0f};
  auto where = [](size_t i) { return "x[" + std::to_string(i) + "]"; };
  EXPECT_TRUE(all_near(close.data(), want.data(), 4, 1e-6, where));
  const std::vector<float> off = {1, 2, 3.5f, 4};
  const ::testing::AssertionResult r = all_near(off.data(), want.data(), 4, 1e-6, where);
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("1 of 4 values over the limit 1e-06; worst: x[2]: got 3.5, want 3 (0.5)"),
            std::string::npos)
      << r.message();
}
