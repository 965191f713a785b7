// Tests for the JSON reader and writer: RFC 8259 examples, every error class with its line:column, and
// round trips.
#include "01_sequence/base/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "01_sequence/base/common.h"
#include "01_sequence/base/utf8.h"

using nanovllm::Error;
using nanovllm::Json;

namespace {

// The message of the Error that parsing `text` throws, or "" if it parses.
std::string parse_error(const std::string& text) {
  try {
    Json::parse(text, "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Ch01_Json, ParsesNestedValues) {
  Json v = Json::parse(R"({"a": [1, -2.5, 3e2, true, false, null], "b": {"c": "d"}, "e": ""})", "t");
  ASSERT_TRUE(v.is_object());
  const auto& a = v.at("a").as_array();
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[0].as_int64(), 1);
  EXPECT_TRUE(a[0].is_integer());
  EXPECT_DOUBLE_EQ(a[1].as_double(), -2.5);
  EXPECT_FALSE(a[1].is_integer());
  EXPECT_DOUBLE_EQ(a[2].as_double(), 300.0);
  EXPECT_EQ(a[2].as_int64(), 300);  // integral doubles are accepted as integers
  EXPECT_TRUE(a[3].as_bool());
  EXPECT_FALSE(a[4].as_bool());
  EXPECT_TRUE(a[5].is_null());
  EXPECT_EQ(v.at("b").at("c").as_string(), "d");
  EXPECT_EQ(v.at("e").as_string(), "");
  EXPECT_EQ(v.find("zzz"), nullptr);
}

TEST(Ch01_Json, Int64LimitsAreExact) {
  Json v = Json::parse("[9223372036854775807, -9223372036854775808, 9223372036854775808]", "t");
  EXPECT_EQ(v.as_array()[0].as_int64(), INT64_MAX);
  EXPECT_EQ(v.as_array()[1].as_int64(), INT64_MIN);
  EXPECT_FALSE(v.as_array()[2].is_integer());  // one past the int64 range...
  EXPECT_EQ(v.as_array()[2].as_uint64(), 9223372036854775808ull);  // ...is still an exact uint64
  EXPECT_DOUBLE_EQ(v.as_array()[2].as_double(), 9223372036854775808.0);
  Json u = Json::parse("[18446744073709551615, 18446744073709551616, -1]", "t");
  EXPECT_EQ(u.as_array()[0].as_uint64(), UINT64_MAX);
  EXPECT_EQ(u.as_array()[0].dump(), "18446744073709551615");
  EXPECT_THROW(u.as_array()[1].as_uint64(), Error);  // beyond 64 bits: only a double
  EXPECT_THROW(u.as_array()[2].as_uint64(), Error);
  EXPECT_EQ(Json(uint64_t(1) << 63).dump(), "9223372036854775808");
}

TEST(Ch01_Json, ZeroIsAnUnsignedInteger) {
  // as_uint64 is exact on [0, 2^64), 0 included (a request's "seed": 0 is read through it).
  EXPECT_EQ(Json::parse("0", "t").as_uint64(), 0u);
  EXPECT_EQ(Json::parse("[0, 1]", "t").as_array()[0].as_uint64(), 0u);
}

TEST(Ch01_Json, StringEscapesAndSurrogatePairs) {
  Json v = Json::parse(R"(["\"\\\/\b\f\n\r\t", "\u00e9\u4e2d", "\ud83d\ude00", "é中😀"])", "t");
  const auto& a = v.as_array();
  EXPECT_EQ(a[0].as_string(), "\"\\/\b\f\n\r\t");
  EXPECT_EQ(a[1].as_string(), "\xc3\xa9\xe4\xb8\xad");
  EXPECT_EQ(a[2].as_string(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(a[3].as_string(), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
  // RFC 8259 section 7: "The hexadecimal letters A through F can be uppercase or lowercase" (Python writes
  // lowercase; other writers, and people, do not).
  Json upper = Json::parse(R"(["\u00E9\u4E2D", "\uD83D\uDE00", "\u00Ff"])", "t");
  EXPECT_EQ(upper.as_array()[0].as_string(), "\xc3\xa9\xe4\xb8\xad");
  EXPECT_EQ(upper.as_array()[1].as_string(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(upper.as_array()[2].as_string(), "\xc3\xbf");  // U+00FF
}

TEST(Ch01_Json, WhiteSpaceIsSpaceTabLineFeedAndCarriageReturnOnly) {
  // RFC 8259 section 2: ws = *( %x20 / %x09 / %x0A / %x0D ). A file written on Windows (CRLF) reads as its LF twin;
  // a form feed or a vertical tab, white space to isspace(), is no JSON white space (Python refuses both too).
  EXPECT_EQ(Json::parse("{\r\n  \"a\": [1,\t2]\r\n}\r\n", "t").dump(), "{\"a\":[1,2]}");
  EXPECT_EQ(Json::parse(" \t\r\n7 \t\r\n", "t").as_int64(), 7);
  EXPECT_EQ(parse_error("\f1"), "t.json:1:1: unexpected character (expected a JSON value)");
  EXPECT_EQ(parse_error("1\v"), "t.json:1:2: unexpected text after the JSON value");
  EXPECT_EQ(parse_error("[1,\xc2\xa0" "2]"), "t.json:1:4: unexpected character (expected a JSON value)");  // U+00A0
}

TEST(Ch01_Json, WhatRfc8259AndPythonRefuseInStrings) {
  // A high surrogate followed by an escape that is not a low surrogate: Python reads "\ud800\u0041" as a
  // lone surrogate then 'A', and a lone surrogate has no UTF-8 form, so it is refused, as "\ud800" alone is.
  EXPECT_NE(parse_error(R"("\ud800\u0041")").find("high surrogate not followed by a low surrogate"), std::string::npos);
  EXPECT_NE(parse_error(R"("\udbff\uffff")").find("high surrogate not followed by a low surrogate"), std::string::npos);
  // RFC 8259 section 7: every byte below 0x20 must be escaped in a string (Python: "Invalid control
  // character"); 0x20 itself need not be.
  for (int c = 0; c < 0x20; c++)
    EXPECT_NE(parse_error(std::string("\"a") + char(c) + "b\"").find("control character"), std::string::npos) << "byte " << c;
  EXPECT_EQ(Json::parse("\"a b\"", "t").as_string(), "a b");
  // A \u escape cut short by the end of the text is an error about the escape, found without reading
  // past the text: here the byte after the 6-byte view is a hex digit.
  const char buffer[] = {'"', '\\', 'u', '1', '2', '3', '4', '"'};
  try {
    Json::parse(std::string_view(buffer, 6), "t.json");
    ADD_FAILURE() << "a truncated \\u escape parsed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "t.json:1:4: truncated \\u escape");
  }
}

TEST(Ch01_Json, ErrorsNameLineAndColumn) {
  EXPECT_EQ(parse_error("{\n  \"a\": 1,\n}"), "t.json:3:1: expected a string key in the object");
  EXPECT_EQ(parse_error("[1 2]"), "t.json:1:4: expected ',' or ']' after an array element");
  EXPECT_EQ(parse_error("{\"a\" 1}"), "t.json:1:6: expected ':' after an object key");
  EXPECT_EQ(parse_error("[1,]"), "t.json:1:4: unexpected character (expected a JSON value)");
  EXPECT_EQ(parse_error("01"), "t.json:1:2: leading zeros are not allowed in numbers");
  EXPECT_EQ(parse_error("1."), "t.json:1:3: expected a digit after the decimal point");
  EXPECT_EQ(parse_error("-"), "t.json:1:2: expected a digit in the number");
  EXPECT_EQ(parse_error("1e"), "t.json:1:3: expected a digit in the exponent");
  EXPECT_EQ(parse_error("\"abc"), "t.json:1:5: unterminated string");
  EXPECT_EQ(parse_error("\"a\tb\""), "t.json:1:3: control character in a string (must be escaped)");
  EXPECT_EQ(parse_error("\"\\x\""), "t.json:1:3: invalid escape in a string");
  EXPECT_EQ(parse_error("\"\\ud800\""), "t.json:1:8: lone high surrogate in \\u escape");
  EXPECT_EQ(parse_error("\"\\udc00\""), "t.json:1:8: lone low surrogate in \\u escape");
  EXPECT_EQ(parse_error("\"\\u12g4\""), "t.json:1:6: invalid hex digit in \\u escape");
  EXPECT_EQ(parse_error("\"\xff\""), "t.json:1:2: invalid UTF-8 in a string");
  EXPECT_EQ(parse_error("\"\xc0\xaf\""), "t.json:1:2: invalid UTF-8 in a string");  // overlong '/'
  EXPECT_EQ(parse_error("\"\xed\xa0\x80\""), "t.json:1:2: invalid UTF-8 in a string");  // surrogate
  EXPECT_EQ(parse_error("tru"), "t.json:1:1: invalid literal (expected a JSON value)");
  EXPECT_EQ(parse_error("NaN"), "t.json:1:1: unexpected character (expected a JSON value)");
  EXPECT_EQ(parse_error("// c\n1"), "t.json:1:1: unexpected character (expected a JSON value)");
  EXPECT_EQ(parse_error("1 2"), "t.json:1:3: unexpected text after the JSON value");
  EXPECT_EQ(parse_error(""), "t.json:1:1: unexpected end of input (expected a JSON value)");
  EXPECT_EQ(parse_error("[" + std::string(600, '[')), "t.json:1:513: nesting deeper than 512 levels");
  // The boundary: 512 arrays one in another parse, a value innermost or none; the 513th is refused.
  EXPECT_EQ(parse_error(std::string(513, '[') + std::string(513, ']')), "t.json:1:513: nesting deeper than 512 levels");
}

TEST(Ch01_Json, NestingOf512LevelsParses) {
  Json empty = Json::parse(std::string(512, '[') + std::string(512, ']'), "t.json");
  Json one = Json::parse(std::string(512, '[') + "1" + std::string(512, ']'), "t.json");
  int levels = 0;
  const Json* j = &one;
  for (; j->is_array() && j->size() == 1; j = &j->as_array()[0]) levels++;
  EXPECT_EQ(levels, 512);
  EXPECT_EQ(j->as_int64(), 1);
  EXPECT_TRUE(empty.is_array());
}

// A line of a JSON Lines stream is named by its source ("stdin line 3"), so its errors give the column alone.
TEST(Ch01_Json, ALineNamesOnlyItsColumn) {
  try {
    Json::parse_line("{\"a\" 1}", "stdin line 3");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "stdin line 3, column 6: expected ':' after an object key");
  }
  EXPECT_EQ(Json::parse_line("[1, 2]", "stdin line 1").dump(), Json::parse("[1, 2]", "t").dump());
}

TEST(Ch01_Json, AccessorsReportTypeMismatch) {
  Json v = Json::parse(R"({"s": "x", "n": 1.5})", "t");
  try {
    v.at("s").as_int64();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "expected an integer, got a string");
  }
  try {
    v.at("n").as_int64();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "expected an integer, got 1.5");
  }
  try {
    v.at("missing");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "missing field 'missing'");
  }
}

TEST(Ch01_Json, DuplicateKeysLastWins) {
  Json v = Json::parse(R"({"a": 1, "a": 2})", "t");
  EXPECT_EQ(v.at("a").as_int64(), 2);
}

TEST(Ch01_Json, DumpEscapesAndReplacesInvalidUtf8) {
  Json v = Json::object();
  v.set("text", std::string("a\"b\\c\n\x01\xff\xc3\xa9"));
  v.set("n", int64_t(-7));
  v.set("x", 0.1);
  Json a = Json::array();
  a.push_back(Json());
  a.push_back(true);
  v.set("a", a);
  EXPECT_EQ(v.dump(), "{\"text\":\"a\\\"b\\\\c\\n\\u0001\xef\xbf\xbd\xc3\xa9\",\"n\":-7,\"x\":0.1,\"a\":[null,true]}");
}

TEST(Ch01_Json, EveryControlCharacterIsWrittenEscapedAsPythonWritesIt) {
  // RFC 8259 section 7: every byte below 0x20 must be escaped in a string. Python's json.dumps writes the five
  // that have a short form as \b \t \n \f \r and the others as \u00xx, lowercase; each reads back as itself.
  static const char* kHex = "0123456789abcdef";
  for (int c = 0; c < 0x20; c++) {
    std::string expected;
    switch (c) {
      case '\b': expected = "\\b"; break;
      case '\t': expected = "\\t"; break;
      case '\n': expected = "\\n"; break;
      case '\f': expected = "\\f"; break;
      case '\r': expected = "\\r"; break;
      default: expected = std::string("\\u00") + kHex[c >> 4] + kHex[c & 15];
    }
    const std::string text(1, char(c));
    EXPECT_EQ(Json(text).dump(), "\"" + expected + "\"") << "byte " << c;
    EXPECT_EQ(parse_error(Json(text).dump()), "") << "byte " << c;
  }
}

TEST(Ch01_Json, RandomDoublesRoundTrip) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; i++) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, 8);
    if (!std::isfinite(d)) continue;
    Json back = Json::parse(Json(d).dump(), "t");
    ASSERT_EQ(back.as_double(), d) << Json(d).dump();
    ASSERT_FALSE(back.is_integer()) << Json(d).dump();  // a double reads back as a double, 2.0 included
  }
}

TEST(Ch01_Json, DoublesWithoutAFractionAreWrittenAsDoubles) {
  // 1.0 was written "1", which reads back as an integer, and an error quoting a token id of 1.0 said "got 1".
  EXPECT_EQ(Json(1.0).dump(), "1.0");
  EXPECT_EQ(Json(-2.0).dump(), "-2.0");
  EXPECT_EQ(Json(0.0).dump(), "0.0");
  EXPECT_EQ(Json(100.0).dump(), "100.0");
  EXPECT_EQ(Json(1e6).dump(), "1e+06");  // the shortest form, which has an exponent
  EXPECT_EQ(Json(1e20).dump(), "1e+20");  // an exponent already says double
  EXPECT_EQ(Json(0.5).dump(), "0.5");
  EXPECT_EQ(Json(int64_t(1)).dump(), "1");
  EXPECT_EQ(Json::parse("[1.0,1e2,7]", "t").dump(), "[1.0,100.0,7]");
}

TEST(Ch01_Json, NumbersADoubleCannotHoldReadAsPythonAndWriteAsTheyWereRead) {
  // As Python's json: 1e400 is an infinity, 1e-400 zero. Written back as read, so that a message quoting
  // one shows what the file holds (they were written 1e999 and -9223372036854775808), and the text reads
  // back as the same value.
  for (const char* text : {"1e400", "-1e400", "1e999"}) {
    Json value = Json::parse(text, "t");
    ASSERT_TRUE(std::isinf(value.as_double())) << text;
    const std::string written = value.dump();
    EXPECT_EQ(written, text);
    EXPECT_EQ(Json::parse(written, "t").as_double(), value.as_double()) << text;
  }
  EXPECT_EQ(Json::parse("1e-400", "t").as_double(), 0.0);  // an underflow is zero
  // ... of its sign, as Python's json.loads("-1e-400") is -0.0.
  EXPECT_TRUE(std::signbit(Json::parse("-1e-400", "t").as_double()));
  EXPECT_FALSE(std::signbit(Json::parse("1e-400", "t").as_double()));
  EXPECT_EQ(Json::parse("[1e-400]", "t").dump(), "[1e-400]");
  // Integers past 64 bits: a double, not an integer, quoted as written.
  for (const char* text : {"-9223372036854775809", "18446744073709551616"}) {
    Json value = Json::parse(text, "t");
    EXPECT_FALSE(value.is_integer()) << text;
    EXPECT_EQ(value.dump(), text);
  }
  // An infinity made in code has no text to quote: 1e999, which reads back as the same infinity.
  EXPECT_EQ(Json(HUGE_VAL).dump(), "1e999");
  EXPECT_EQ(Json(-HUGE_VAL).dump(), "-1e999");
}

TEST(Ch01_Json, FloatWriterIsShortestRoundTrip) {
  std::string out;
  nanovllm::json_append_float(out, 0.1f);
  EXPECT_EQ(out, "0.1");
  out.clear();
  nanovllm::json_append_float(out, NAN);
  EXPECT_EQ(out, "null");
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.f, 30.f);
  for (int i = 0; i < 2000; i++) {
    float f = normal(rng);
    out.clear();
    nanovllm::json_append_float(out, f);
    ASSERT_EQ(float(Json::parse(out, "t").as_double()), f) << out;
  }
}

// utf8.h against RFC 3629's table: utf8_decode refuses code points past U+10FFFF, every surrogate (U+D800-U+DFFF, the
// last one too), a continuation byte that is no 10xxxxxx, and a sequence cut by the end of its range even where the
// bytes after the range would complete it; utf8_append uses 2 bytes up to U+07FF, 3 up to U+FFFF, 4 beyond; check_utf8
// names the first byte that starts no character, 0x80 included.
TEST(Ch01_Utf8, DecodeEncodeAndCheckFollowRfc3629) {
  auto decode = [](const std::string& s) {
    uint32_t cp = 0;
    return nanovllm::utf8_decode(s.data(), s.size(), &cp);
  };
  EXPECT_EQ(decode("\xF4\x8F\xBF\xBF"), 4u);  // U+10FFFF, the last code point
  EXPECT_EQ(decode("\xF4\x90\x80\x80"), 0u);  // U+110000
  EXPECT_EQ(decode("\xED\x9F\xBF"), 3u);      // U+D7FF
  EXPECT_EQ(decode("\xED\xA0\x80"), 0u);      // U+D800
  EXPECT_EQ(decode("\xED\xBF\xBF"), 0u);      // U+DFFF
  EXPECT_EQ(decode("\xEE\x80\x80"), 3u);      // U+E000
  EXPECT_EQ(decode("\xC3\xC3"), 0u);          // 11xxxxxx is no continuation
  EXPECT_EQ(decode("\xC3\xA9"), 2u);          // U+00E9
  EXPECT_EQ(decode("\xC0\x80"), 0u);          // overlong U+0000
  const std::string euro = "\xE2\x82\xAC";    // U+20AC
  uint32_t cp = 0;
  EXPECT_EQ(nanovllm::utf8_decode(euro.data(), 3, &cp), 3u);
  EXPECT_EQ(cp, 0x20ACu);
  EXPECT_EQ(nanovllm::utf8_decode(euro.data(), 2, &cp), 0u);  // the range ends inside the character
  auto encode = [](uint32_t c) {
    std::string out;
    nanovllm::utf8_append(out, c);
    return out;
  };
  EXPECT_EQ(encode(0x7F), "\x7F");
  EXPECT_EQ(encode(0x7FF), "\xDF\xBF");
  EXPECT_EQ(encode(0x800), "\xE0\xA0\x80");
  EXPECT_EQ(encode(0xFFFF), "\xEF\xBF\xBF");
  EXPECT_EQ(encode(0x10000), "\xF0\x90\x80\x80");
  EXPECT_EQ(encode(0x10FFFF), "\xF4\x8F\xBF\xBF");
  std::string error;
  try {
    nanovllm::check_utf8("ab\x80", "t");
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "t: invalid UTF-8 at byte offset 2 (byte 0x80)");
}
