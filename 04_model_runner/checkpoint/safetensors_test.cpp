// Tests for the safetensors reader and writer: the golden checkpoints against numbers computed
// independently from their raw bytes, every class of malformed header with its message, the writer's
// exact bytes and round trip, sharded and multi-file checkpoints.
#include "04_model_runner/checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "01_sequence/base/bf16.h"
#include "01_sequence/base/json.h"
#include "04_model_runner/checkpoint/config.h"
#include "tests/test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

// A safetensors file made by hand: the 8-byte little-endian length, `header`, then `data_size` bytes
// 0, 1, 2, ... (mod 256).
std::vector<uint8_t> make_file(const std::string& header, size_t data_size) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; i++) bytes[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_size; i++) bytes.push_back(uint8_t(i));
  return bytes;
}

std::string parse_error(const std::string& header, size_t data_size) {
  std::vector<uint8_t> bytes = make_file(header, data_size);
  return error_of([&] { parse_safetensors(bytes.data(), bytes.size(), "t.safetensors"); });
}

double sum_as_float(const TensorView& view) {
  std::vector<float> values(size_t(view.numel()));
  read_as_float(view, values.data());
  double sum = 0;
  for (float v : values) sum += v;
  return sum;
}

uint16_t u16_at(const TensorView& view, int64_t i) {
  uint16_t h;
  std::memcpy(&h, view.data + 2 * i, 2);
  return h;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The golden checkpoints. Known answers below were computed with Python's standard library only (no
// safetensors, no numpy), straight from the file bytes: struct.unpack('<Q') for the header length,
// json.loads for the header, struct.unpack('<H') for the bf16 words, floats via
// struct.unpack('<f', struct.pack('<I', word << 16)), sums with math.fsum.

TEST(Ch04_Safetensors, GoldenCheckpointsHoldTheQwen3Layout) {
  for (const char* name : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    SCOPED_TRACE(name);
    const std::string dir = golden_dir(name);
    ModelConfig config = ModelConfig::load(dir);
    Checkpoint checkpoint = Checkpoint::open(dir);
    std::vector<TensorSpec> layout = qwen3_checkpoint_layout(config);
    // a: 2 layers * 11 + embed + norm = 24 (tied); b: 3 * 11 + 2 + lm_head = 36.
    EXPECT_EQ(layout.size(), std::string(name) == "tiny-qwen3-a" ? 24u : 36u);
    EXPECT_EQ(checkpoint.size(), layout.size());  // nothing more, nothing less
    for (const TensorSpec& spec : layout) {
      const TensorView* view = checkpoint.find(spec.name);
      ASSERT_NE(view, nullptr) << spec.name;
      EXPECT_EQ(view->shape, spec.shape) << spec.name;
      EXPECT_EQ(view->dtype, DType::BF16) << spec.name;
      EXPECT_EQ(view->nbytes, size_t(view->numel()) * 2);
    }
    EXPECT_NO_THROW(checkpoint.check_layout(layout));
  }
}

TEST(Ch04_Safetensors, GoldenAValuesMatchTheRawBytes) {
  Checkpoint checkpoint = Checkpoint::open(golden_dir("tiny-qwen3-a"));
  const TensorView& norm = checkpoint.get("model.norm.weight", {64});
  EXPECT_EQ(u16_at(norm, 0), 0x3f70);
  EXPECT_EQ(u16_at(norm, 3), 0x3f96);
  std::vector<float> values(64);
  read_as_float(norm, values.data());
  EXPECT_EQ(values[0], 0.9375f);
  EXPECT_EQ(values[1], 0.890625f);
  EXPECT_EQ(values[2], 1.09375f);
  EXPECT_EQ(values[3], 1.171875f);
  EXPECT_DOUBLE_EQ(sum_as_float(norm), 64.703125);

  const TensorView& embed = checkpoint.get("model.embed_tokens.weight", {512, 64});
  std::vector<float> e(512 * 64);
  read_as_float(embed, e.data());
  EXPECT_EQ(e[0], -0.1259765625f);
  EXPECT_EQ(e[3 * 64 + 10], -0.220703125f);
  EXPECT_EQ(e[511 * 64 + 63], -0.66015625f);
  EXPECT_NEAR(sum_as_float(embed), 143.07597896456718, 1e-9);

  const TensorView& q = checkpoint.get("model.layers.1.self_attn.q_proj.weight", {512, 64});
  std::vector<float> qv(512 * 64);
  read_as_float(q, qv.data());
  EXPECT_EQ(qv[3 * 64 + 10], 0.1435546875f);
  double sumsq = 0;
  for (float v : qv) sumsq += double(v) * v;
  EXPECT_NEAR(sumsq, 510.83051807243004, 1e-9);
}

TEST(Ch04_Safetensors, GoldenBValuesMatchTheRawBytes) {
  Checkpoint checkpoint = Checkpoint::open(golden_dir("tiny-qwen3-b"));
  const TensorView& head = checkpoint.get("lm_head.weight", {1000, 96});
  std::vector<float> h(1000 * 96);
  read_as_float(head, h.data());
  EXPECT_EQ(h[0], -0.0274658203125f);
  EXPECT_EQ(h[2], 0.478515625f);
  EXPECT_EQ(h[3 * 96 + 10], 0.0888671875f);
  EXPECT_EQ(h[999 * 96 + 95], -0.2294921875f);
  EXPECT_NEAR(sum_as_float(head), -331.1717622280121, 1e-9);

  const TensorView& down = checkpoint.get("model.layers.2.mlp.down_proj.weight", {96, 192});
  EXPECT_EQ(u16_at(down, 0), 0xb85d);
  EXPECT_NEAR(sum_as_float(down), -7.978476595133543, 1e-9);
  EXPECT_DOUBLE_EQ(sum_as_float(checkpoint.get("model.norm.weight", {96})), 95.26171875);
}

TEST(Ch04_Safetensors, GoldenDataSectionChecksum) {
  // The sum of every little-endian 16-bit word of the data section; the tensors tile it exactly.
  const std::pair<const char*, uint64_t> cases[] = {{"tiny-qwen3-a", 8961661129ull},
                                                     {"tiny-qwen3-b", 21024382542ull}};
  for (const auto& [name, expected] : cases) {
    Checkpoint checkpoint = Checkpoint::open(golden_dir(name));
    uint64_t sum = 0;
    for (const std::string& tensor : checkpoint.names()) {
      const TensorView& view = *checkpoint.find(tensor);
      for (int64_t i = 0; i < view.numel(); i++) sum += u16_at(view, i);
    }
    EXPECT_EQ(sum, expected) << name;
  }
}

// ---------------------------------------------------------------------------------------------------
// Malformed files: one message each, naming the file and the tensor.

TEST(Ch04_Safetensors, SizeMismatchMessage) {
  EXPECT_EQ(parse_error(R"({"model.norm.weight":{"dtype":"BF16","shape":[64],"data_offsets":[0,10]}})", 200),
            "t.safetensors: tensor 'model.norm.weight': data_offsets [0, 10] hold 10 bytes but BF16 [64] "
            "needs 128");
}

TEST(Ch04_Safetensors, MalformedHeadersGiveOneNamedError) {
  struct Case {
    std::string header;
    size_t data_size;
    std::string expected;  // a substring of the message
  };
  const std::string ok_entry = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  const std::vector<Case> cases = {
      {"[1,2]", 0, "t.safetensors: header must be a JSON object, got an array"},
      {"{\"a\":", 0, "t.safetensors: header:1:6: unexpected end of input"},
      {"{\"a\":{" + ok_entry + "}} trailing", 8, "t.safetensors: header:1:"},
      {R"({"a":{"dtype":"bf16","shape":[2],"data_offsets":[0,4]}})", 8, "tensor 'a': unknown dtype 'bf16'"},
      {R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,4]}})", 8, "tensor 'a': field 'dtype': expected a string, got a number"},
      {R"({"a":{"shape":[2],"data_offsets":[0,4]}})", 8, "tensor 'a': missing field 'dtype'"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 8, "tensor 'a': missing field 'shape'"},
      {R"({"a":{"dtype":"F32","shape":[1]}})", 8, "tensor 'a': missing field 'data_offsets'"},
      {R"({"a":[]})", 8, "tensor 'a': expected an object {dtype, shape, data_offsets}, got an array"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 8, "tensor 'a': field 'shape': entries must be non-negative integers, got -1"},
      {R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8, "entries must be non-negative integers, got 2.0"},
      {R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8, "entries must be non-negative integers, got \"2\""},
      {R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8, "entries must be non-negative integers"},
      {R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, "tensor 'a': shape [4294967296, 4294967296] is too large"},
      {R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", 8, "is too large"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "tensor 'a': data_offsets [8, 0] end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "tensor 'a': field 'data_offsets': expected [begin, end] as two non-negative integers, got [0]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8, "expected [begin, end] as two non-negative integers, got [-8,0]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8, "tensor 'a': data_offsets [4, 12] lie outside the data section (8 bytes)"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})", 8,
       "t.safetensors: tensors 'a' and 'b' overlap (data_offsets [0, 8] and [4, 8])"},
      {R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[5,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8,
       "tensors 'a' and 'b' overlap"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
       "t.safetensors: tensor 'a' appears twice in the header"},
      {R"({"__metadata__":{"format":1}})", 0, "t.safetensors: __metadata__ entry 'format' must be a string, got a number"},
      {R"({"__metadata__":["pt"]})", 0, "t.safetensors: __metadata__ must be an object of strings, got an array"},
      // A shape of many dimensions is quoted by its first 8 (a hostile one had 4 million: a 12 MB message).
      {R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,2],"data_offsets":[0,1]}})", 1,
       "tensor 'a': data_offsets [0, 1] hold 1 bytes but U8 [1, 1, 1, 1, 1, 1, 1, 1, ... (10 dimensions)] needs 2"},
  };
  for (const Case& c : cases) {
    std::string message = parse_error(c.header, c.data_size);
    EXPECT_NE(message.find(c.expected), std::string::npos) << "header: " << c.header << "\nmessage: " << message;
    EXPECT_EQ(message.rfind("t.safetensors: ", 0), 0u) << message;  // every message names the file
  }
}

TEST(Ch04_Safetensors, LengthFieldIsCheckedAgainstTheFile) {
  std::vector<uint8_t> bytes = make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_EQ(error_of([&] { parse_safetensors(bytes.data(), 5, "t.safetensors"); }),
            "t.safetensors: file is 5 bytes, too short for a safetensors header");
  EXPECT_EQ(error_of([&] { parse_safetensors(nullptr, 0, "t.safetensors"); }),
            "t.safetensors: file is 0 bytes, too short for a safetensors header");
  // Truncated inside the header.
  EXPECT_NE(error_of([&] { parse_safetensors(bytes.data(), 20, "t.safetensors"); })
                .find("header length 53 exceeds the file (12 bytes after the length field)"),
            std::string::npos);
  // A header past 16 MiB is refused before it is parsed (its JSON tree could take a GB).
  std::vector<uint8_t> large = make_file(std::string((16 << 20) + 1, ' '), 0);
  EXPECT_EQ(error_of([&] { parse_safetensors(large.data(), large.size(), "t.safetensors"); }),
            "t.safetensors: header length 16777217 is more than the 16 MiB this reader takes for a header");
  // A length of 2^64 - 1 must not be taken as a size to allocate.
  std::memset(bytes.data(), 0xff, 8);
  EXPECT_NE(error_of([&] { parse_safetensors(bytes.data(), bytes.size(), "t.safetensors"); })
                .find("header length 18446744073709551615 exceeds the file"),
            std::string::npos);
}

TEST(Ch04_Safetensors, AcceptsWhatHuggingFaceAccepts) {
  // Null metadata, unknown extra fields, an empty header, scalars, empty tensors (also with huge other
  // dimensions), gaps between tensors, and data past the last tensor.
  const std::string header =
      R"({"__metadata__":null,"s":{"dtype":"F64","shape":[],"data_offsets":[0,8],"extra":1},)"
      R"("e":{"dtype":"BF16","shape":[4294967296,4294967296,0],"data_offsets":[8,8]},)"
      R"("b":{"dtype":"BOOL","shape":[2],"data_offsets":[12,14]}})";
  std::vector<uint8_t> bytes = make_file(header, 20);
  std::vector<TensorView> tensors = parse_safetensors(bytes.data(), bytes.size(), "t.safetensors");
  ASSERT_EQ(tensors.size(), 3u);
  EXPECT_EQ(tensors[0].name, "s");
  EXPECT_TRUE(tensors[0].shape.empty());
  EXPECT_EQ(tensors[0].numel(), 1);
  EXPECT_EQ(tensors[1].numel(), 0);
  EXPECT_EQ(tensors[1].nbytes, 0u);
  EXPECT_EQ(tensors[2].dtype, DType::BOOL);
  EXPECT_EQ(tensors[2].data, bytes.data() + 8 + header.size() + 12);
  EXPECT_EQ(tensors[2].data[0], 12);  // make_file's data bytes count up from 0

  // An empty tensor holds no bytes, so it overlaps nothing, even at another tensor's start (Hugging Face
  // sorts the entries by offsets and needs each to begin where the one before ended: (0,0), then (0,8)).
  std::vector<uint8_t> starts = make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                          R"("z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 8);
  std::vector<TensorView> both;
  ASSERT_NO_THROW(both = parse_safetensors(starts.data(), starts.size(), "t.safetensors"));
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].nbytes + both[1].nbytes, 8u);

  std::vector<uint8_t> empty = make_file("{}", 0);
  EXPECT_TRUE(parse_safetensors(empty.data(), empty.size(), "t").empty());
  // Every dtype name of dtype.h is read, with its size in bytes as the format defines it (the element's
  // bits / 8; BOOL is one byte). Two elements each, at offsets the header gives from that size: a size
  // taken from dtype_size itself on both sides would agree with any dtype_size.
  const std::pair<const char*, size_t> sizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                  {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  for (const auto& [dtype, size] : sizes) {
    DType t;
    ASSERT_TRUE(dtype_from_name(dtype, &t));
    std::string h = std::string(R"({"x":{"dtype":")") + dtype + R"(","shape":[2],"data_offsets":[0,)" +
                    std::to_string(2 * size) + "]}}";
    std::vector<uint8_t> one = make_file(h, 16);
    std::vector<TensorView> parsed;
    ASSERT_EQ(error_of([&] { parsed = parse_safetensors(one.data(), one.size(), "t"); }), "") << dtype;
    EXPECT_STREQ(dtype_name(parsed.at(0).dtype), dtype);
    EXPECT_EQ(parsed.at(0).nbytes, 2 * size) << dtype;
    EXPECT_EQ(dtype_size(t), size) << dtype;
  }
}

TEST(Ch04_Safetensors, ReadAsFloatConvertsEachFloatType) {
  // bf16 0x3fc0 = 1.5, 0xc040 = -3; f16 0x3c00 = 1, 0xc000 = -2, 0x7bff = 65504 (largest), 0x0001 = 2^-24
  // (smallest subnormal); f32 bit patterns of 0.1f and -0.0f.
  const uint16_t bf16[] = {0x3fc0, 0xc040};
  const uint16_t f16[] = {0x3c00, 0xc000, 0x7bff, 0x0001};
  const float f32[] = {0.1f, -0.0f};
  const int64_t i64[] = {7};
  TempDir dir;
  write_safetensors(dir / "x.safetensors", {{"bf16", DType::BF16, {2}, bf16, {}},
                                            {"f16", DType::F16, {2, 2}, f16, {}},
                                            {"f32", DType::F32, {2}, f32, {}},
                                            {"i64", DType::I64, {1}, i64, {}}});
  Checkpoint c = Checkpoint::open(dir.path());
  float out[4];
  read_as_float(*c.find("bf16"), out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -3.0f);
  read_as_float(*c.find("f16"), out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));
  read_as_float(*c.find("f32"), out);
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_TRUE(std::signbit(out[1]));
  EXPECT_EQ(error_of([&] { read_as_float(*c.find("i64"), out); }),
            dir / "x.safetensors" + ": tensor 'i64' is I64, not one of the float types read (BF16, F16 or F32)");
}

// bf16.h's host conversions, known answers worked out from the formats. float_to_bf16 rounds to nearest, ties to even
// (1 + 2^-8 is halfway between 1 and 1 + 2^-7: down to the even 0x3f80; 1 + 3 2^-8 halfway between 0x3f81 and 0x3f82:
// up to the even 0x3f82), keeps infinities, and keeps a NaN a NaN, quiet, even one whose payload is only in the low
// 16 bits it drops. fp16_to_float keeps the sign of zero and of subnormals (mantissa m: m 2^-24) and a NaN a NaN.
TEST(Ch04_Safetensors, Bf16AndFp16ConversionsKnownAnswers) {
  auto bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);  // above half: up
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) - std::ldexp(1.0f, -20)), 0x3f80);  // below half: down
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16(bits(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds up to infinity, as torch rounds it
  EXPECT_EQ(float_to_bf16(bits(0x7fc00000)), 0x7fc0);
  for (uint32_t nan : {0x7f800001u, 0xff800001u, 0x7f80ffffu}) {
    const uint16_t h = float_to_bf16(bits(nan));
    EXPECT_TRUE(std::isnan(bf16_to_float(h))) << std::hex << nan << " -> " << h;
    EXPECT_TRUE(h & 0x0040) << std::hex << nan << " -> " << h << " is not a quiet NaN";
  }
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.0f, -14));  // the smallest normal
  EXPECT_EQ(fp16_to_float(0x0200), std::ldexp(1.0f, -15));  // subnormal 512 2^-24
  EXPECT_EQ(fp16_to_float(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_TRUE(fp16_to_float(0x8000) == 0.0f && std::signbit(fp16_to_float(0x8000)));
  EXPECT_EQ(fp16_to_float(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7c01)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0xfe00)));
}

TEST(Ch04_Safetensors, ReadAsFloatRefusesNaNAndInfinity) {
  // A NaN weight made every logit NaN, found only at the first step, with no tensor named. Each float type's
  // patterns with an exponent of all ones: NaN, +Inf, -Inf; beside them the largest finite values, which
  // are accepted.
  const uint16_t bf16_ok[] = {0x7f7f, 0xff7f}, bf16_nan[] = {0x3f80, 0x7fc1}, bf16_inf[] = {0xff80, 0x3f80};
  const uint16_t f16_ok[] = {0x7bff, 0xfbff}, f16_nan[] = {0x3c00, 0x7e00}, f16_inf[] = {0x7c00, 0x3c00};
  const uint32_t f32_ok[] = {0x7f7fffff, 0x00000001}, f32_nan[] = {0x3f800000, 0xffc00000}, f32_inf[] = {0x7f800000, 0};
  TempDir dir;
  write_safetensors(dir / "x.safetensors", {{"bf16_ok", DType::BF16, {2}, bf16_ok, {}},
                                            {"bf16_nan", DType::BF16, {2}, bf16_nan, {}},
                                            {"bf16_inf", DType::BF16, {2}, bf16_inf, {}},
                                            {"f16_ok", DType::F16, {2}, f16_ok, {}},
                                            {"f16_nan", DType::F16, {2}, f16_nan, {}},
                                            {"f16_inf", DType::F16, {2}, f16_inf, {}},
                                            {"f32_ok", DType::F32, {2}, f32_ok, {}},
                                            {"f32_nan", DType::F32, {2}, f32_nan, {}},
                                            {"f32_inf", DType::F32, {2}, f32_inf, {}}});
  Checkpoint c = Checkpoint::open(dir.path());
  const std::string file = dir / "x.safetensors";
  float out[2];
  for (const char* type : {"bf16", "f16", "f32"}) {
    const std::string name = type;
    EXPECT_EQ(error_of([&] { read_as_float(*c.find(name + "_ok"), out); }), "") << type;
    EXPECT_TRUE(std::isfinite(out[0]) && std::isfinite(out[1])) << type;
    EXPECT_EQ(error_of([&] { read_as_float(*c.find(name + "_nan"), out); }),
              file + ": tensor '" + name + "_nan' holds a NaN (element 1 of 2)");
    EXPECT_EQ(error_of([&] { read_as_float(*c.find(name + "_inf"), out); }),
              file + ": tensor '" + name + "_inf' holds an infinity (element 0 of 2)");
  }
}

// ---------------------------------------------------------------------------------------------------
// The writer

TEST(Ch04_Safetensors, WriterProducesTheExpectedBytes) {
  // Spelled out by hand from the format's definition: length, header padded with spaces to a multiple
  // of 8, then the data.
  const float data[] = {1.0f, 2.0f};
  TempDir dir;
  write_safetensors(dir / "w.safetensors", {{"a", DType::F32, {2}, data, {}}}, {{"format", "pt"}});
  const std::string header = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(header.size(), 85u);
  std::vector<uint8_t> expected = {88, 0, 0, 0, 0, 0, 0, 0};  // 85 rounded up to 88
  expected.insert(expected.end(), header.begin(), header.end());
  expected.insert(expected.end(), 3, ' ');
  for (uint8_t b : {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40}) expected.push_back(b);  // 1.0f, 2.0f
  EXPECT_EQ(read_bytes(dir / "w.safetensors"), expected);
}

TEST(Ch04_Safetensors, WriterRoundTripIsByteIdentical) {
  // Several dtypes, odd sizes (so padding matters), a scalar, an empty tensor, and one made by `fill`.
  std::vector<uint16_t> bf16(3 * 5);
  for (size_t i = 0; i < bf16.size(); i++) bf16[i] = float_to_bf16(float(i) * 0.25f - 1.0f);
  const uint8_t u8[] = {1, 2, 3};
  const double scalar[] = {3.25};
  const int32_t unused[] = {0};
  std::vector<TensorToWrite> tensors = {
      {"layer.weight", DType::BF16, {3, 5}, bf16.data(), {}},
      {"bytes", DType::U8, {3}, u8, {}},
      {"scalar", DType::F64, {}, scalar, {}},
      {"empty", DType::I32, {0, 4}, unused, {}},
      {"filled", DType::I16, {7}, nullptr, [](uint8_t* out) { for (int i = 0; i < 14; i++) out[i] = uint8_t(100 + i); }},
  };
  TempDir dir;
  write_safetensors(dir / "one.safetensors", tensors, {{"format", "pt"}, {"note", "caf\xc3\xa9"}});
  const std::vector<uint8_t> first = read_bytes(dir / "one.safetensors");
  // The data section starts 8-byte aligned and the header's padding is spaces.
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; i--) header_size = (header_size << 8) | first[i];
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(first.size(), 8 + header_size + 30 + 3 + 8 + 0 + 14);

  SafetensorsFile file = SafetensorsFile::open(dir / "one.safetensors");
  ASSERT_EQ(file.tensors().size(), tensors.size());
  std::vector<TensorToWrite> again;
  for (size_t i = 0; i < tensors.size(); i++) {
    const TensorView& view = file.tensors()[i];
    EXPECT_EQ(view.name, tensors[i].name);  // in the given order
    EXPECT_EQ(view.dtype, tensors[i].dtype);
    EXPECT_EQ(view.shape, tensors[i].shape);
    again.push_back({view.name, view.dtype, view.shape, view.data, {}});
  }
  EXPECT_EQ(std::memcmp(file.tensors()[0].data, bf16.data(), 30), 0);
  EXPECT_EQ(file.tensors()[4].data[13], 113);
  // Writing the views back gives the same file, byte for byte.
  write_safetensors(dir / "two.safetensors", again, {{"format", "pt"}, {"note", "caf\xc3\xa9"}});
  EXPECT_EQ(read_bytes(dir / "two.safetensors"), first);
  EXPECT_FALSE(is_regular_file(dir / "two.safetensors.tmp." + std::to_string(getpid())));  // renamed
}

TEST(Ch04_Safetensors, WriterRefusesBadInputAndLeavesNoFile) {
  const float data[] = {1.0f};
  TempDir dir;
  EXPECT_NE(error_of([&] { write_safetensors(dir / "x.safetensors", {{"a", DType::F32, {1}, data, {}},
                                                                      {"a", DType::F32, {1}, data, {}}}); })
                .find("cannot write tensor 'a': empty, reserved or duplicate name"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(dir / "x.safetensors", {{"a", DType::F32, {1}, nullptr, {}}}); })
                .find("no data"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { write_safetensors(dir / "no/such/dir/x.safetensors", {{"a", DType::F32, {1}, data, {}}}); })
                .rfind(dir / "no/such/dir/x.safetensors: cannot write", 0),
            0u);
  // A fill callback that throws: its exception passes through and no file (or temp file) remains.
  EXPECT_THROW(write_safetensors(dir / "x.safetensors",
                                 {{"a", DType::F32, {1}, nullptr, [](uint8_t*) { throw std::runtime_error("x"); }}}),
               std::runtime_error);
  // The folder is empty: neither x.safetensors nor the temporary x.safetensors.tmp.<pid> the writer fills
  // first (which Checkpoint::open below would not see: it is no *.safetensors file).
  EXPECT_FALSE(is_regular_file(dir / "x.safetensors.tmp." + std::to_string(getpid())));
  EXPECT_EQ(folder_entries(dir.path()), std::set<std::string>{}) << "files left behind by the failed writes";
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            dir.path() + ": no model weights (no *.safetensors file, no model.safetensors.index.json)");
}

// ---------------------------------------------------------------------------------------------------
// Checkpoints: one file, several files, shards with an index

namespace {

const float kOnes[6] = {1, 1, 1, 1, 1, 1};

}  // namespace

TEST(Ch04_Safetensors, ShardedCheckpointThroughTheIndex) {
  TempDir dir;
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8};
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {{"x.weight", DType::F32, {2, 3}, a, {}}, {"unlisted", DType::F32, {1}, a, {}}});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {{"y.weight", DType::F32, {2}, b, {}}});
  write_string(dir / "model.safetensors.index.json",
               R"({"metadata":{"total_size":32},"weight_map":{"x.weight":"model-00001-of-00002.safetensors",)"
               R"("y.weight":"model-00002-of-00002.safetensors"}})");
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"x.weight", "y.weight"}));  // the index is the contents
  float out[6];
  read_as_float(c.get("x.weight", {2, 3}), out);
  EXPECT_EQ(out[5], 6.0f);
  read_as_float(c.get("y.weight", {2}), out);
  EXPECT_EQ(out[1], 8.0f);
  EXPECT_EQ(c.find("y.weight")->file, dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(c.find("unlisted"), nullptr);

  // Moving the checkpoint keeps the views valid (the mappings do not move).
  Checkpoint moved = std::move(c);
  read_as_float(moved.get("x.weight", {2, 3}), out);
  EXPECT_EQ(out[0], 1.0f);
}

TEST(Ch04_Safetensors, BrokenIndexGivesNamedErrors) {
  TempDir dir;
  const std::string index = dir / "model.safetensors.index.json";
  write_safetensors(dir / "s1.safetensors", {{"x", DType::F32, {1}, kOnes, {}}});
  write_string(index, R"({"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": shard 's2.safetensors' (of tensor 'y') does not exist in " + dir.path());
  write_string(index, R"({"weight_map":{"x":"s1.safetensors","y":"."}})");  // it said "does not exist"
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": shard '.' (of tensor 'y') is a directory in " + dir.path());
  // A shard that exists but is no file, a link to nothing, a link loop: each said "does not exist".
  write_string(index, R"({"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})");
  ASSERT_EQ(mkfifo((dir / "s2.safetensors").c_str(), 0600), 0);
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": shard 's2.safetensors' (of tensor 'y') is not a regular file in " + dir.path());
  std::remove((dir / "s2.safetensors").c_str());
  ASSERT_EQ(symlink("nowhere.safetensors", (dir / "s2.safetensors").c_str()), 0);
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": shard 's2.safetensors' (of tensor 'y') is a symbolic link to nothing in " + dir.path());
  std::remove((dir / "s2.safetensors").c_str());
  ASSERT_EQ(symlink("s2.safetensors", (dir / "s2.safetensors").c_str()), 0);
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": shard 's2.safetensors' (of tensor 'y') cannot be read (" + std::strerror(ELOOP) + ") in " +
                dir.path());
  std::remove((dir / "s2.safetensors").c_str());
  write_string(index, R"({"weight_map":{"x":"s1.safetensors","y":"s1.safetensors"}})");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": tensor 'y' is listed in shard 's1.safetensors', which does not hold it");
  write_string(index, R"({"metadata":{}})");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }), index + ": missing field 'weight_map'");
  write_string(index, R"({"weight_map":{"x":3}})");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": weight_map['x']: expected a shard file name, got a number");
  write_string(index, R"({"weight_map":{"x":"../s1.safetensors"}})");
  EXPECT_NE(error_of([&] { Checkpoint::open(dir.path()); }).find("is not a file name in"), std::string::npos);
  // A NUL cut the path short, so that "s1.safetensors\u0000.x" opened s1.safetensors; it is quoted escaped.
  write_string(index, R"({"weight_map":{"x":"s1.safetensors\u0000.x"}})");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            index + ": weight_map['x']: 's1.safetensors\\x00.x' is not a file name in " + dir.path());
  write_string(index, R"({"weight_map":{"x":"s1.safetensors","x":"s1.safetensors"}})");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }), index + ": tensor 'x' is listed twice");
  write_string(index, R"({"weight_map":)");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }).rfind(index + ":1:", 0), 0u);
}

TEST(Ch04_Safetensors, SeveralFilesWithoutIndex) {
  TempDir dir;
  write_safetensors(dir / "b.safetensors", {{"w2", DType::F32, {1}, kOnes, {}}});
  write_safetensors(dir / "a.safetensors", {{"w1", DType::F32, {2}, kOnes, {}}});
  write_string(dir / "notes.txt", "not a checkpoint");
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"w1", "w2"}));
  // The same tensor name in two files: which one is meant? An error naming both files.
  write_safetensors(dir / "c.safetensors", {{"w1", DType::F32, {2}, kOnes, {}}});
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            dir.path() + ": tensor 'w1' appears in both " + (dir / "a.safetensors") + " and " + (dir / "c.safetensors"));
  // A corrupt file among them names that file.
  write_string(dir / "c.safetensors", "garbage");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }),
            dir / "c.safetensors" + ": file is 7 bytes, too short for a safetensors header");
  // Something that is not a regular file must not block or crash the open.
  std::remove((dir / "c.safetensors").c_str());
  ASSERT_EQ(mkfifo((dir / "fifo.safetensors").c_str(), 0600), 0);
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir.path()); }), dir / "fifo.safetensors" + ": not a regular file");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir / "missing"); }),
            dir / "missing" + ": no such model folder (No such file or directory)");
}

TEST(Ch04_Safetensors, GetChecksShapesAgainstTheConfig) {
  Checkpoint c = Checkpoint::open(golden_dir("tiny-qwen3-a"));
  const std::string file = golden_dir("tiny-qwen3-a") + "/model.safetensors";
  EXPECT_EQ(error_of([&] { c.get("model.embed_tokens.weight", {64, 512}); }),
            file + ": tensor 'model.embed_tokens.weight' has shape [512, 64], expected [64, 512] (from config.json)");
  EXPECT_EQ(error_of([&] { c.get("lm_head.weight", {512, 64}); }),
            golden_dir("tiny-qwen3-a") + ": the checkpoint has no tensor 'lm_head.weight'");
  // Checkpoint a against the layout of b's config: the first mismatch is the embedding.
  std::vector<TensorSpec> layout_b = qwen3_checkpoint_layout(ModelConfig::load(golden_dir("tiny-qwen3-b")));
  EXPECT_EQ(error_of([&] { c.check_layout(layout_b); }),
            file + ": tensor 'model.embed_tokens.weight' has shape [512, 64], expected [1000, 96] (from config.json)");
}

TEST(Ch04_Safetensors, TiedCheckpointMayStillHoldLmHead) {
  // Some tied exports carry lm_head.weight as a copy of the embedding; it must load.
  Checkpoint golden = Checkpoint::open(golden_dir("tiny-qwen3-a"));
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : golden.names()) {
    const TensorView& v = *golden.find(name);
    tensors.push_back({name, v.dtype, v.shape, v.data, {}});
  }
  const TensorView& embed = *golden.find("model.embed_tokens.weight");
  tensors.push_back({"lm_head.weight", embed.dtype, embed.shape, embed.data, {}});
  TempDir dir;
  write_safetensors(dir / "model.safetensors", tensors);
  ModelConfig config = ModelConfig::load(golden_dir("tiny-qwen3-a"));
  ASSERT_TRUE(config.tie_word_embeddings);
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_NO_THROW(c.check_layout(qwen3_checkpoint_layout(config)));
  EXPECT_NE(c.find("lm_head.weight"), nullptr);

  // Each of the float types loads (read_as_float converts them): the layout given as F16 (the same bytes
  // read as another 2-byte float), and as F32 (zeros: only the header is checked here).
  for (DType dtype : {DType::F16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<TensorToWrite> as = tensors;
    for (TensorToWrite& t : as) {
      t.dtype = dtype;
      if (dtype == DType::F32) t.data = nullptr, t.fill = [](uint8_t*) {};
    }
    write_safetensors(dir / "model.safetensors", as);
    Checkpoint other = Checkpoint::open(dir.path());
    EXPECT_EQ(error_of([&] { other.check_layout(qwen3_checkpoint_layout(config)); }), "");
  }

  // A weight stored as an integer type is refused.
  tensors[0].dtype = DType::I16;
  write_safetensors(dir / "model.safetensors", tensors);
  Checkpoint bad = Checkpoint::open(dir.path());
  EXPECT_NE(error_of([&] { bad.check_layout(qwen3_checkpoint_layout(config)); })
                .find("is I16; model weights must be BF16, F16 or F32"),
            std::string::npos);
}
