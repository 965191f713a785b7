// A randomized corruption test for the safetensors reader. From one small valid file we make thousands
// of mangled ones (truncated, bytes flipped, absurd header lengths, header JSON rewritten with bad
// dtypes, offsets, shapes, overlaps, duplicate names) and require of each: parse_safetensors either
// succeeds with every invariant holding (checked here independently of the reader, and by touching every
// byte it hands out, which AddressSanitizer watches under `make SANITIZE=1`) or throws nanovllm::Error.
// Anything else (a crash, another exception type) fails the test. The seed is fixed, so a failure
// reproduces; the iteration number is in the failure message.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "04_model_runner/checkpoint/safetensors.h"
#include "tests/test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

// One header entry with each field as raw JSON text, so that a mutation can put any value there. An
// empty field is left out of the header.
struct RawEntry {
  std::string name, dtype, shape, offsets, extra;
};

const std::vector<RawEntry> kBase = {
    {"w.bf16", "\"BF16\"", "[2,3]", "[0,12]", ""},
    {"v.f32", "\"F32\"", "[3]", "[12,24]", ""},
    {"i.i64", "\"I64\"", "[1]", "[24,32]", ""},
    {"u.u8", "\"U8\"", "[0,5]", "[32,32]", ""},
    {"b.bool", "\"BOOL\"", "[5]", "[32,37]", ""},
};
constexpr size_t kBaseData = 37;

std::string render(const std::vector<RawEntry>& entries, const std::string& metadata) {
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + metadata;
  for (const RawEntry& e : entries) {
    if (h.size() > 1) h += ",";
    h += "\"" + e.name + "\":{";
    std::string fields;
    auto add = [&](const char* key, const std::string& value) {
      if (value.empty()) return;
      if (!fields.empty()) fields += ",";
      fields += std::string("\"") + key + "\":" + value;
    };
    add("dtype", e.dtype);
    add("shape", e.shape);
    add("data_offsets", e.offsets);
    if (!e.extra.empty()) fields += (fields.empty() ? "" : ",") + e.extra;
    h += fields + "}";
  }
  return h + "}";
}

std::vector<uint8_t> assemble(uint64_t length_field, const std::string& header, size_t data_size) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; i++) bytes[i] = uint8_t(length_field >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_size; i++) bytes.push_back(uint8_t(i * 37 + 11));
  return bytes;
}

class Mangler {
 public:
  explicit Mangler(uint64_t seed) : rng_(seed) {}
  // A uniform index below n (by modulo; the tiny bias is irrelevant here, and unlike
  // std::uniform_int_distribution it is the same with every standard library).
  size_t below(size_t n) { return size_t(rng_() % n); }
  template <class T>
  const T& pick(const std::vector<T>& values) { return values[below(values.size())]; }
  uint64_t bits() { return rng_(); }

  std::string random_dims() {
    static const std::vector<std::string> pool = {"0", "1", "2", "3", "5", "12", "-1", "2.0", "\"3\"", "null",
                                                  "[]", "1e3", "4294967296", "9223372036854775807",
                                                  "9223372036854775808", "3037000500"};
    static const std::vector<std::string> not_arrays = {"3", "\"[3]\"", "null", "{}", "true"};
    if (below(8) == 0) return pick(not_arrays);
    std::string s = "[";
    for (size_t i = 0, n = below(5); i < n; i++) s += (i ? "," : "") + pick(pool);
    return s + "]";
  }
  std::string random_offsets() {
    static const std::vector<std::string> pool = {"0", "4", "8", "12", "24", "32", "36", "37", "38", "-1", "1.5",
                                                  "\"0\"", "null", "9223372036854775807", "18446744073709551615",
                                                  "18446744073709551616"};
    static const std::vector<std::string> not_arrays = {"0", "\"[0,4]\"", "{}", "null"};
    if (below(8) == 0) return pick(not_arrays);
    std::string s = "[";
    const size_t n = below(6) == 0 ? below(4) : 2;
    for (size_t i = 0; i < n; i++) s += (i ? "," : "") + pick(pool);
    return s + "]";
  }

  // The header with 1 to 3 random edits.
  std::string mangled_header() {
    static const std::vector<std::string> dtypes = {"\"BF16\"", "\"F32\"", "\"F64\"", "\"I8\"", "\"BOOL\"", "\"bf16\"",
                                                    "\"F8_E4M3\"", "\"\"", "7", "null", "[\"F32\"]", "{}"};
    static const std::vector<std::string> metadata = {"", "{\"format\":\"pt\"}", "null", "{\"a\":1}", "[]",
                                                      "\"pt\"", "{\"a\":\"b\",\"c\":{}}"};
    static const std::vector<std::string> extras = {"\"extra\":1", "\"dtype\":\"F32\"", "\"shape\":[]",
                                                    "\"data_offsets\":[0,0]"};
    std::vector<RawEntry> entries = kBase;
    std::string meta = below(2) ? "{\"format\":\"pt\"}" : "";
    for (size_t edit = 0, n = 1 + below(3); edit < n; edit++) {
      RawEntry& e = entries.empty() ? entries.emplace_back(kBase[0]) : entries[below(entries.size())];
      switch (below(11)) {
        case 0: e.dtype = pick(dtypes); break;
        case 1: e.shape = random_dims(); break;
        case 2: e.offsets = random_offsets(); break;
        case 3: e.offsets = pick(entries).offsets; break;  // often an overlap
        case 4: e.name = pick(entries).name; break;        // often a duplicate
        case 5: e.name = below(2) ? "__metadata__" : ""; break;
        case 6: (below(3) == 0 ? e.dtype : below(2) ? e.shape : e.offsets) = ""; break;  // drop a field
        case 7: e.extra = pick(extras); break;
        case 8: meta = pick(metadata); break;
        case 9: entries.erase(entries.begin() + long(below(entries.size()))); break;
        case 10: entries.push_back(pick(entries)); break;
      }
    }
    return render(entries, meta);
  }

 private:
  std::mt19937_64 rng_;  // fully specified by the standard: the same sequence everywhere
};

// Checks everything parse_safetensors promises about a file it accepted, without trusting it.
void check_invariants(const std::vector<uint8_t>& bytes, const std::vector<TensorView>& tensors) {
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; i--) header_size = (header_size << 8) | bytes[i];
  ASSERT_LE(header_size, bytes.size() - 8);
  const uint8_t* data_begin = bytes.data() + 8 + header_size;
  const uint8_t* file_end = bytes.data() + bytes.size();
  std::set<std::string> names;
  for (const TensorView& t : tensors) {
    ASSERT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;
    ASSERT_NE(t.name, "__metadata__");
    __int128 numel = 1;
    bool empty = false;
    for (int64_t d : t.shape) {
      ASSERT_GE(d, 0);
      if (d == 0) {
        empty = true;
      } else if (numel < (__int128(1) << 64)) {
        numel *= d;  // stops growing past 2^64: large enough to fail the check below anyway
      }
    }
    if (empty) numel = 0;
    ASSERT_EQ(__int128(t.nbytes), numel * __int128(dtype_size(t.dtype))) << t.name;
    if (t.nbytes == 0) continue;
    ASSERT_GE(t.data, data_begin) << t.name;
    ASSERT_LE(t.data + t.nbytes, file_end) << t.name;
  }
  for (size_t i = 0; i < tensors.size(); i++)
    for (size_t j = i + 1; j < tensors.size(); j++) {
      const TensorView &a = tensors[i], &b = tensors[j];
      if (a.nbytes && b.nbytes) {
        ASSERT_TRUE(a.data + a.nbytes <= b.data || b.data + b.nbytes <= a.data) << a.name << " / " << b.name;
      }
    }
  // Touch every byte handed out (ASan reports any read outside `bytes`).
  unsigned sum = 0;
  for (const TensorView& t : tensors) {
    for (size_t k = 0; k < t.nbytes; k++) sum += t.data[k];
    if (t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32) {
      std::vector<float> out(size_t(t.numel()));
      try {
        read_as_float(t, out.data());
      } catch (const Error& e) {  // random bytes may hold a NaN or an infinity, which is refused
        ASSERT_NE(std::string(e.what()).find("' holds "), std::string::npos) << e.what();
      }
    }
  }
  (void)sum;
}

enum class Outcome { Accepted, Refused };

Outcome try_parse(const std::vector<uint8_t>& original) {
  // An exactly sized heap copy, so that AddressSanitizer sees any read past the end.
  std::unique_ptr<uint8_t[]> exact(new uint8_t[std::max<size_t>(original.size(), 1)]);
  if (!original.empty()) std::memcpy(exact.get(), original.data(), original.size());
  std::vector<TensorView> tensors;
  try {
    tensors = parse_safetensors(original.empty() ? nullptr : exact.get(), original.size(), "fuzz.safetensors");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("fuzz.safetensors: ", 0), 0u) << e.what();
    return Outcome::Refused;
  }
  // Views point into `exact`; rebase them onto `original` for the independent checks.
  for (TensorView& t : tensors) t.data = original.data() + (t.data - exact.get());
  check_invariants(original, tensors);
  return Outcome::Accepted;
}

}  // namespace

TEST(Ch04_SafetensorsFuzz, MangledFilesAreReadOrRefusedNeverCrash) {
  const std::string base_header = render(kBase, "{\"format\":\"pt\"}");
  const std::vector<uint8_t> base = assemble(base_header.size(), base_header, kBaseData);
  ASSERT_EQ(try_parse(base), Outcome::Accepted);

  Mangler m(20240601);
  int accepted = 0, refused = 0;
  const int kIterations = 6000;
  for (int it = 0; it < kIterations; it++) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    std::vector<uint8_t> bytes = base;
    std::string kind;
    switch (m.below(6)) {
      case 0: {  // truncated anywhere: the last tensor ends at the end of the file, so always refused
        bytes.resize(m.below(base.size()));
        ASSERT_EQ(try_parse(bytes), Outcome::Refused) << "truncated to " << bytes.size();
        refused++;
        continue;
      }
      case 1: {  // flipped bytes in the data section only: the header is intact, so always accepted
        for (size_t k = 0, n = 1 + m.below(8); k < n; k++)
          bytes[8 + base_header.size() + m.below(kBaseData)] ^= uint8_t(1 + m.below(255));
        ASSERT_EQ(try_parse(bytes), Outcome::Accepted);
        accepted++;
        continue;
      }
      case 2:  // flipped bytes anywhere (length field and header included)
        for (size_t k = 0, n = 1 + m.below(8); k < n; k++) bytes[m.below(bytes.size())] ^= uint8_t(1 + m.below(255));
        break;
      case 3: {  // an absurd header length
        static const std::vector<uint64_t> lengths = {0, 1, 7, UINT64_MAX, UINT64_MAX - 7, uint64_t(1) << 63,
                                                      uint64_t(INT64_MAX), 1ull << 32};
        uint64_t length = m.below(2) ? m.pick(lengths) : m.bits() >> m.below(64);
        for (int i = 0; i < 8; i++) bytes[i] = uint8_t(length >> (8 * i));
        break;
      }
      default: {  // the header rewritten with random edits, the length field usually right
        std::string header = m.mangled_header();
        uint64_t length = header.size();
        if (m.below(5) == 0) length += uint64_t(int64_t(m.below(9)) - 4);
        size_t data_size = m.below(4) == 0 ? m.below(2 * kBaseData) : kBaseData;
        bytes = assemble(length, header, data_size);
        break;
      }
    }
    (try_parse(bytes) == Outcome::Accepted ? accepted : refused)++;
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Both outcomes must be common, or the mutations are not exercising the reader.
  EXPECT_GT(accepted, kIterations / 10);
  EXPECT_GT(refused, kIterations / 2);
  std::printf("  %d mangled files: %d accepted with invariants holding, %d refused with an Error\n", kIterations,
              accepted, refused);
}

TEST(Ch04_SafetensorsFuzz, MangledFilesOnDisk) {
  // The same through SafetensorsFile::open (mmap), on two hundred real files.
  TempDir dir;
  const std::string path = dir / "x.safetensors";
  Mangler m(7);
  int accepted = 0, refused = 0;
  for (int it = 0; it < 200; it++) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    std::string header = m.mangled_header();
    std::vector<uint8_t> bytes = assemble(header.size(), header, kBaseData);
    if (m.below(3) == 0) bytes.resize(m.below(bytes.size() + 1));
    write_bytes(path, bytes);
    // The mapped file must give the same verdict as the in-memory parse of the same bytes, and the same
    // tensors with the same contents.
    std::string memory_error;
    std::vector<TensorView> expected;
    try {
      expected = parse_safetensors(bytes.data(), bytes.size(), path);
    } catch (const Error& e) {
      memory_error = e.what();
    }
    try {
      SafetensorsFile file = SafetensorsFile::open(path);
      ASSERT_EQ(memory_error, "");
      ASSERT_EQ(file.tensors().size(), expected.size());
      for (size_t i = 0; i < expected.size(); i++) {
        const TensorView &got = file.tensors()[i], &want = expected[i];
        EXPECT_EQ(got.name, want.name);
        EXPECT_EQ(got.file, path);
        EXPECT_EQ(got.shape, want.shape);
        ASSERT_EQ(got.nbytes, want.nbytes);
        EXPECT_EQ(std::memcmp(got.data, want.data, got.nbytes), 0);
      }
      accepted++;
    } catch (const Error& e) {
      EXPECT_EQ(e.what(), memory_error);
      refused++;
    }
  }
  EXPECT_GT(accepted, 10);
  EXPECT_GT(refused, 100);
}
