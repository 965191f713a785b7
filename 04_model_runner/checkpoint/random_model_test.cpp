// Tests for random checkpoints: known values from an independent implementation of the generator,
// determinism, loading back through Checkpoint and ModelConfig, the distributions, the presets' sizes,
// and the command line.
#include "04_model_runner/checkpoint/random_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tests/test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

// Small, untied, with an embedding of 2048 x 64 = 131072 values: two generator chunks of 65536.
ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 2048;
  c.hidden_size = 64;
  c.intermediate_size = 192;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e4;
  c.tie_word_embeddings = false;
  c.dtype = "bfloat16";
  c.eos_token_ids = {1, 2};
  c.bos_token_id = 0;
  return c;
}

uint16_t word(const TensorView& view, int64_t i) {
  uint16_t h;
  std::memcpy(&h, view.data + 2 * i, 2);
  return h;
}

struct Moments {
  double mean, std, within_one_std, kurtosis;
};

// Mean, standard deviation, the fraction within one std of the mean, and the kurtosis (3 for a normal).
Moments moments(const TensorView& view) {
  std::vector<float> v(size_t(view.numel()));
  read_as_float(view, v.data());
  double sum = 0, sumsq = 0;
  for (float x : v) sum += x, sumsq += double(x) * x;
  const double n = double(v.size()), mean = sum / n, var = sumsq / n - mean * mean, std = std::sqrt(var);
  double within = 0, fourth = 0;
  for (float x : v) {
    double d = x - mean;
    within += std::fabs(d) < std;
    fourth += d * d * d * d;
  }
  return {mean, std, within / n, fourth / n / (var * var)};
}

}  // namespace

TEST(Ch04_RandomModel, KnownValuesFromAnIndependentImplementation) {
  // Expected words come from a separate Python implementation (standard library only) written from the
  // description in random_model.cpp: splitmix64 seeding of (seed, tensor index, chunk of 65536),
  // xoshiro256**, the polar method in double with math.log and math.sqrt, then float32 and bf16
  // round-to-nearest-even; seed 1234. Tensor indices follow qwen3_checkpoint_layout: 0 embed_tokens,
  // 1 layers.0.input_layernorm, 2 layers.0.self_attn.q_proj, 22 layers.1.mlp.down_proj, 24 lm_head.
  TempDir dir;
  write_random_model(small_config(), dir.path(), 1234);
  Checkpoint c = Checkpoint::open(dir.path());
  auto word_sum = [](const TensorView& view) {
    uint64_t sum = 0;
    for (int64_t i = 0; i < view.numel(); i++) sum += word(view, i);
    return sum;
  };
  const TensorView& embed = c.get("model.embed_tokens.weight", {2048, 64});
  EXPECT_EQ(word(embed, 0), 0x3f26);
  EXPECT_EQ(word(embed, 1), 0x3f88);
  EXPECT_EQ(word(embed, 2), 0x3e33);
  EXPECT_EQ(word(embed, 3), 0x3f3e);
  EXPECT_EQ(word(embed, 65536), 0x3f2f);  // the second chunk's own stream
  EXPECT_EQ(word(embed, 65537), 0x3e02);
  EXPECT_EQ(word_sum(embed), 4246712595u);
  const TensorView& norm = c.get("model.layers.0.input_layernorm.weight", {64});
  EXPECT_EQ(word(norm, 0), 0x3f41);
  EXPECT_EQ(word(norm, 1), 0x3f81);
  EXPECT_EQ(word(norm, 2), 0x3f70);
  const TensorView& q = c.get("model.layers.0.self_attn.q_proj.weight", {64, 64});
  EXPECT_EQ(word(q, 0), 0x3d63);
  EXPECT_EQ(word(q, 1), 0xbd2e);
  EXPECT_EQ(word(q, 2), 0x3e40);
  EXPECT_EQ(word_sum(c.get("model.layers.1.mlp.down_proj.weight", {64, 192})), 393374482u);
  EXPECT_EQ(word_sum(c.get("lm_head.weight", {2048, 64})), 4232474099u);
}

TEST(Ch04_RandomModel, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir a, b, other;
  write_random_model(small_config(), a.path(), 42);
  write_random_model(small_config(), b.path(), 42);
  write_random_model(small_config(), other.path(), 43);
  for (const char* file : {"model.safetensors", "config.json", "generation_config.json"})
    EXPECT_EQ(read_bytes(a / file), read_bytes(b / file)) << file;
  const std::vector<uint8_t> x = read_bytes(a / "model.safetensors"), y = read_bytes(other / "model.safetensors");
  ASSERT_EQ(x.size(), y.size());  // same header, different data
  size_t differing = 0;
  for (size_t i = 0; i < x.size(); i += 2) differing += x[i] != y[i] || x[i + 1] != y[i + 1];
  EXPECT_GT(differing, x.size() / 2 * 9 / 10);  // almost every weight differs
  // Writing into an existing folder replaces the files.
  write_random_model(small_config(), a.path(), 43);
  EXPECT_EQ(read_bytes(a / "model.safetensors"), y);
}

TEST(Ch04_RandomModel, TinyPresetLoadsBackWithTokenizer) {
  const std::string tokenizer = data_dir() + "/qwen3-tokenizer";
  if (!is_regular_file(tokenizer + "/tokenizer.json")) GTEST_SKIP() << "run `make` first to unpack " << tokenizer;
  TempDir dir;
  write_random_model("tiny", dir.path(), 0, tokenizer);
  const ModelConfig config = ModelConfig::load(dir.path());
  EXPECT_EQ(config.vocab_size, 151936);
  EXPECT_EQ(config.hidden_size, 64);
  EXPECT_EQ(config.intermediate_size, 192);
  EXPECT_EQ(config.num_hidden_layers, 2);
  EXPECT_EQ(config.num_attention_heads, 4);
  EXPECT_EQ(config.num_key_value_heads, 2);
  EXPECT_EQ(config.head_dim, 32);
  EXPECT_EQ(config.max_position_embeddings, 4096);
  EXPECT_EQ(config.rope_theta, 1e6);
  EXPECT_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int>{151645, 151643}));
  EXPECT_EQ(config.bos_token_id, 151643);
  Checkpoint checkpoint = Checkpoint::open(dir.path());
  const std::vector<TensorSpec> layout = qwen3_checkpoint_layout(config);
  EXPECT_NO_THROW(checkpoint.check_layout(layout));
  EXPECT_EQ(checkpoint.size(), layout.size());  // tied: no lm_head.weight
  EXPECT_EQ(checkpoint.find("lm_head.weight"), nullptr);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(read_bytes(dir / file), read_bytes(tokenizer + "/" + file)) << file;
}

TEST(Ch04_RandomModel, WeightsFollowTheIntendedDistributions) {
  // hidden 4096 so that the norm weights are 4096 values and q_proj has fan_in 4096.
  ModelConfig config = small_config();
  config.vocab_size = 256;
  config.hidden_size = 4096;
  config.intermediate_size = 64;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.head_dim = 64;
  TempDir dir;
  write_random_model(config, dir.path(), 7);
  Checkpoint c = Checkpoint::open(dir.path());
  // Tolerances are about 5 standard errors: for n samples the mean's error is std / sqrt(n) and the
  // std's relative error 1 / sqrt(2n). bf16 rounding (relative 2^-9) adds no bias at this precision.
  struct Case {
    const char* name;
    double mean, std, n;
  };
  const Case cases[] = {
      {"model.embed_tokens.weight", 0.0, 0.5, 256 * 4096},
      {"lm_head.weight", 0.0, 0.5, 256 * 4096},
      {"model.layers.0.self_attn.q_proj.weight", 0.0, 1.0 / 64, 128 * 4096},  // fan_in 4096
      {"model.layers.0.mlp.down_proj.weight", 0.0, 1.0 / 8, 4096 * 64},        // fan_in 64
      {"model.layers.0.input_layernorm.weight", 1.0, 0.1, 4096},
      {"model.norm.weight", 1.0, 0.1, 4096},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Moments m = moments(*c.find(k.name));
    EXPECT_NEAR(m.mean, k.mean, 5 * k.std / std::sqrt(k.n));
    EXPECT_NEAR(m.std / k.std, 1.0, 5 / std::sqrt(2 * k.n));
    if (k.n > 100000) {  // the shape of a normal: 68.27% within one std, kurtosis 3
      EXPECT_NEAR(m.within_one_std, 0.6827, 0.003);
      EXPECT_NEAR(m.kurtosis, 3.0, 0.05);
    }
  }
}

TEST(Ch04_RandomModel, PresetsHaveTheRealModelsShapes) {
  EXPECT_EQ(random_model_presets(), (std::vector<std::string>{"tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"}));
  // Exact counts, by hand from the shapes (per layer: q + k + v + o + 3 MLP matrices + 4 norm vectors),
  // and in line with Qwen's model cards: 0.6B (0.44B non-embedding), 1.7B (1.4B), 4.0B (3.6B),
  // 8.2B (6.95B). E.g. 0.6B: 28 * (2048*1024 + 2*1024*1024 + 1024*2048 + 3*3072*1024 + 2*1024 + 2*128)
  // + 1024 = 440467456 non-embedding, + 151936*1024 tied embedding = 596049920.
  const std::pair<const char*, int64_t> counts[] = {{"qwen3-0.6b", 596049920},
                                                    {"qwen3-1.7b", 1720574976},
                                                    {"qwen3-4b", 4022468096},
                                                    {"qwen3-8b", 8190735360}};
  for (const auto& [preset, count] : counts) EXPECT_EQ(parameter_count(random_model_config(preset)), count) << preset;
  ModelConfig c = random_model_config("qwen3-8b");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_TRUE(random_model_config("qwen3-4b").tie_word_embeddings);
  EXPECT_EQ(error_of([] { random_model_config("qwen3-70b"); }),
            "unknown preset 'qwen3-70b' (known: tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b)");
}

TEST(Ch04_RandomModel, BadOutputOrTokenizerFolderIsAnError) {
  TempDir dir;
  EXPECT_EQ(error_of([&] { write_random_model(small_config(), dir / "out", 0, dir / "tok"); }),
            dir / "tok/tokenizer.json" + ": no such file (a tokenizer folder needs tokenizer.json)");
  EXPECT_FALSE(is_directory(dir / "out"));  // checked before anything is written
  write_string(dir / "model-00001-of-00002.safetensors", "");
  EXPECT_EQ(error_of([&] { write_random_model(small_config(), dir.path(), 0); }),
            dir.path() + ": already holds another checkpoint (model-00001-of-00002.safetensors); choose an empty folder");
  EXPECT_EQ(error_of([&] { write_random_model(small_config(), dir / "a/b", 0); }).rfind(dir / "a/b: cannot create", 0), 0u);
}

TEST(Ch04_RandomModel, EnsureWritesOnceAndAtomically) {
  TempDir dir;
  const std::string model = dir / "m";
  EXPECT_TRUE(ensure_random_model("tiny", model, 3));
  EXPECT_TRUE(is_complete_random_model(model, false));
  EXPECT_FALSE(is_complete_random_model(model, true));  // no tokenizer was asked for
  const std::vector<uint8_t> bytes = read_bytes(model + "/model.safetensors");
  EXPECT_FALSE(ensure_random_model("tiny", model, 3));  // complete: left alone
  EXPECT_EQ(read_bytes(model + "/model.safetensors"), bytes);
  TempDir again;
  write_random_model("tiny", again.path(), 3);  // the same bytes as a direct write
  EXPECT_EQ(read_bytes(again / "model.safetensors"), bytes);
  // Nothing but the model folder: the temporary one was renamed away.
  EXPECT_EQ(folder_entries(dir.path()), std::set<std::string>{"m"});
  // The folders above it are made as needed (build/data after `make build/nanovllm` alone)...
  EXPECT_TRUE(ensure_random_model("tiny", dir / "data/random/m", 3));
  EXPECT_EQ(read_bytes(dir / "data/random/m/model.safetensors"), bytes);
  // ...and one that cannot be made is named.
  write_string(dir / "file", "");
  EXPECT_EQ(error_of([&] { ensure_random_model("tiny", dir / "file/m", 3); }),
            dir / "file" + ": cannot create the directory: File exists");
  // A folder left incomplete (by an older writer) is not guessed at.
  std::remove((model + "/config.json").c_str());
  EXPECT_EQ(error_of([&] { ensure_random_model("tiny", model, 3); }),
            model + ": exists but is incomplete (an interrupted earlier run?); delete it");
}

TEST(Ch04_RandomModel, AShardIndexInTheOutputFolderIsRefused) {
  // Checkpoint::open reads model.safetensors.index.json when it is there and ignores the files it does not
  // list, so a stale index beside our model.safetensors would load another model (or none): it is refused
  // as a stale shard is, naming it, before anything is written.
  TempDir dir;
  write_string(dir / "model.safetensors.index.json", R"({"weight_map": {}})");
  EXPECT_EQ(error_of([&] { write_random_model(small_config(), dir.path(), 0); }),
            dir.path() + ": already holds another checkpoint (model.safetensors.index.json); choose an empty folder");
  EXPECT_FALSE(is_regular_file(dir / "model.safetensors"));
}

TEST(Ch04_RandomModel, ATokenizerFolderMissingItsConfigIsRefusedBeforeWriting) {
  // A tokenizer folder needs both tokenizer.json and tokenizer_config.json (both are copied). The check comes
  // first, so a folder that has only tokenizer.json fails at once, naming the missing file, and the output
  // folder is never made (not after minutes of writing weights).
  TempDir dir;
  make_directories(dir / "tok");
  write_string(dir / "tok/tokenizer.json", "{}");
  EXPECT_EQ(error_of([&] { write_random_model(small_config(), dir / "out", 0, dir / "tok"); }),
            dir / "tok/tokenizer_config.json" + ": no such file (a tokenizer folder needs tokenizer_config.json)");
  EXPECT_FALSE(is_directory(dir / "out"));
}

TEST(Ch04_RandomModel, TheFileSaysItsFormatIsPytorchAsHuggingFacesWriterDoes) {
  // transformers refuses a .safetensors file whose __metadata__ has no "format" of "pt", "tf", "flax" or "mlx"
  // (modeling_utils.load_state_dict); Hugging Face's own writer (save_file from a torch model) puts
  // {"format": "pt"}. The header is the JSON after the 8-byte little-endian length (safetensors.h).
  TempDir dir;
  write_random_model(small_config(), dir.path(), 0);
  const std::vector<uint8_t> bytes = read_bytes(dir / "model.safetensors");
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | bytes[size_t(i)];
  ASSERT_LE(8 + n, bytes.size());
  const Json header = Json::parse(std::string(bytes.begin() + 8, bytes.begin() + 8 + ptrdiff_t(n)), "header");
  const Json* metadata = header.find("__metadata__");
  ASSERT_NE(metadata, nullptr);
  ASSERT_NE(metadata->find("format"), nullptr);
  EXPECT_EQ(metadata->find("format")->as_string(), "pt");
}

TEST(Ch04_RandomModel, AFolderWithoutGenerationConfigIsIncomplete) {
  // write_random_model writes model.safetensors, config.json and generation_config.json (the EOS ids live in
  // the last, as in Qwen's own folders): a folder missing any of the three is not a complete model, and
  // ensure_random_model refuses it rather than run with other EOS ids.
  TempDir dir;
  const std::string model = dir / "m";
  ASSERT_TRUE(ensure_random_model("tiny", model, 3));
  ASSERT_TRUE(is_complete_random_model(model, false));
  std::remove((model + "/generation_config.json").c_str());
  EXPECT_FALSE(is_complete_random_model(model, false));
  EXPECT_EQ(error_of([&] { ensure_random_model("tiny", model, 3); }),
            model + ": exists but is incomplete (an interrupted earlier run?); delete it");
}

TEST(Ch04_RandomModel, ATensorOfAnOddNumberOfValuesIsWrittenToItsLastValue) {
  // Normals are drawn in pairs (the polar method), so a tensor, or its last chunk of 65,536, with an odd
  // number of values takes only the first of its last pair. Here the largest tensors, the embedding and the
  // LM head, are 2,047 x 63 (odd): every value must be written, the last one too (a value of the stream, not
  // the zero or stale bytes of the buffer), and nothing past it, which `make sanitize` checks (the fill
  // buffer is as large as the largest tensor).
  ModelConfig config = small_config();
  config.vocab_size = 2047;
  config.hidden_size = 63;
  TempDir dir;
  write_random_model(config, dir.path(), 7);
  Checkpoint c = Checkpoint::open(dir.path());
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    const TensorView& t = c.get(name, {2047, 63});
    std::vector<float> v(size_t(t.numel()));
    read_as_float(t, v.data());
    for (size_t i = 0; i < v.size(); i++) ASSERT_TRUE(std::isfinite(v[i])) << name << " value " << i;
    EXPECT_NE(v.back(), 0.0f) << name;
    const Moments m = moments(t);
    EXPECT_NEAR(m.mean, 0.0, 0.007) << name;  // 5 standard errors of the mean: 0.5 / sqrt(128,961) each
    EXPECT_NEAR(m.std, 0.5, 0.01) << name;     // the embedding's and the LM head's stddev
    EXPECT_NEAR(m.within_one_std, 0.683, 0.01) << name;  // a normal's share within one sigma
  }
}
