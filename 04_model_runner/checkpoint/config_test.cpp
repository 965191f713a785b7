// Tests for ModelConfig: the golden configs, transformers 4.x and 5.x spellings, eos as int and list,
// one message per missing / mistyped / inconsistent field, the writer, and the Qwen3 tensor layout.
#include "04_model_runner/checkpoint/config.h"

#include <gtest/gtest.h>

#include "01_sequence/base/json.h"
#include "tests/test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

// A transformers 5 style Qwen3 config like the golden checkpoints', as an editable Json object.
Json base_config() {
  return Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 1,
    "dtype": "bfloat16", "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
    "intermediate_size": 128, "max_position_embeddings": 4096, "model_type": "qwen3",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "tie_word_embeddings": true,
    "use_sliding_window": false, "vocab_size": 512})",
                     "base");
}

// `config` with member `key` removed.
Json without(const Json& config, const std::string& key) {
  Json out = Json::object();
  for (const Json::Member& m : config.as_object())
    if (m.first != key) out.set(m.first, m.second);
  return out;
}

Json with(Json config, const std::string& key, const std::string& json_value) {
  config.set(key, Json::parse(json_value, "value"));
  return config;
}

// Writes `config` as DIR/config.json (and `generation` as generation_config.json unless empty), loads.
ModelConfig load(const TempDir& dir, const Json& config, const std::string& generation = "") {
  write_string(dir / "config.json", config.dump());
  std::remove((dir / "generation_config.json").c_str());
  if (!generation.empty()) write_string(dir / "generation_config.json", generation);
  return ModelConfig::load(dir.path());
}

std::string load_error(const TempDir& dir, const Json& config, const std::string& generation = "") {
  return error_of([&] { load(dir, config, generation); });
}

}  // namespace

TEST(Ch04_Config, GoldenConfigsLoad) {
  // The values of tests/data/golden/tiny-qwen3-{a,b}/config.json and generation_config.json.
  ModelConfig a = ModelConfig::load(golden_dir("tiny-qwen3-a"));
  EXPECT_EQ(a.vocab_size, 512);
  EXPECT_EQ(a.hidden_size, 64);
  EXPECT_EQ(a.num_hidden_layers, 2);
  EXPECT_EQ(a.num_attention_heads, 4);
  EXPECT_EQ(a.num_key_value_heads, 2);
  EXPECT_EQ(a.head_dim, 128);  // given explicitly, not hidden / heads = 16
  EXPECT_EQ(a.intermediate_size, 128);
  EXPECT_EQ(a.max_position_embeddings, 4096);
  EXPECT_EQ(a.rms_norm_eps, 1e-6);
  EXPECT_EQ(a.rope_theta, 1e6);
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(a.dtype, "bfloat16");
  EXPECT_EQ(a.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(a.bos_token_id, 1);

  ModelConfig b = ModelConfig::load(golden_dir("tiny-qwen3-b"));
  EXPECT_EQ(b.vocab_size, 1000);
  EXPECT_EQ(b.hidden_size, 96);
  EXPECT_EQ(b.num_hidden_layers, 3);
  EXPECT_EQ(b.num_attention_heads, 6);
  EXPECT_EQ(b.num_key_value_heads, 2);
  EXPECT_EQ(b.head_dim, 64);
  EXPECT_EQ(b.intermediate_size, 192);
  EXPECT_EQ(b.max_position_embeddings, 2048);
  EXPECT_EQ(b.rope_theta, 1e4);
  EXPECT_FALSE(b.tie_word_embeddings);
}

TEST(Ch04_Config, Transformers4StyleLoads) {
  // transformers 4.x: rope_theta at the top level, rope_scaling null, torch_dtype; head_dim absent
  // (then 128, transformers' Qwen3Config default, not hidden / heads = 16); eos in config.json only;
  // tie_word_embeddings absent (Qwen3 default: false).
  Json config = without(without(without(base_config(), "rope_parameters"), "dtype"), "head_dim");
  config = without(config, "tie_word_embeddings");
  config = with(config, "rope_theta", "10000.0");
  config = with(config, "rope_scaling", "null");
  config = with(config, "torch_dtype", "\"float16\"");
  TempDir dir;
  ModelConfig c = load(dir, config);
  EXPECT_EQ(c.rope_theta, 1e4);
  EXPECT_EQ(c.dtype, "float16");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.head_dim_absent);
  EXPECT_FALSE(load(dir, base_config()).head_dim_absent);
  EXPECT_FALSE(c.tie_word_embeddings);
  // Some versions nest the theta in rope_scaling with rope_type "default"; the nested value wins.
  EXPECT_EQ(load(dir, with(config, "rope_scaling", R"({"rope_type":"default","rope_theta":5e5})")).rope_theta, 5e5);
}

TEST(Ch04_Config, EosTokenIdsAsIntOrList) {
  TempDir dir;
  EXPECT_EQ(load(dir, base_config()).eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(load(dir, with(base_config(), "eos_token_id", "[2, 3]")).eos_token_ids, (std::vector<int>{2, 3}));
  // generation_config.json wins over config.json, as in transformers' generate().
  ModelConfig c = load(dir, base_config(), R"({"bos_token_id": 5, "eos_token_id": [7, 2]})");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{7, 2}));
  EXPECT_EQ(c.bos_token_id, 5);
  // Absent (or null) everywhere: no eos from the model, no bos.
  c = load(dir, without(without(base_config(), "eos_token_id"), "bos_token_id"), R"({"eos_token_id": null})");
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.bos_token_id, -1);
}

TEST(Ch04_Config, EveryMissingRequiredFieldIsNamed) {
  TempDir dir;
  const std::string path = dir / "config.json";
  for (const char* field : {"architectures", "vocab_size", "hidden_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "intermediate_size",
                            "max_position_embeddings", "rms_norm_eps"})
    EXPECT_EQ(load_error(dir, without(base_config(), field)), path + ": missing field '" + field + "'");
  EXPECT_EQ(load_error(dir, without(base_config(), "rope_parameters")),
            path + ": missing field 'rope_parameters.rope_theta' (or 'rope_theta')");
  // The folder itself, before its config.json: missing, or a file given in its place.
  EXPECT_EQ(error_of([&] { ModelConfig::load(dir / "nowhere"); }),
            dir / "nowhere" + ": no such model folder (No such file or directory)");
  EXPECT_EQ(error_of([&] { ModelConfig::load(path); }),
            path + ": not a folder; a model is the folder that holds config.json and *.safetensors");
}

TEST(Ch04_Config, EveryMistypedFieldIsNamed) {
  TempDir dir;
  const std::string path = dir / "config.json";
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"hidden_size", "\"64\"", "field 'hidden_size': expected an integer, got a string"},
      {"hidden_size", "64.5", "field 'hidden_size': expected an integer, got 64.5"},
      {"vocab_size", "null", "field 'vocab_size': expected an integer, got null"},
      {"num_hidden_layers", "[2]", "field 'num_hidden_layers': expected an integer, got an array"},
      {"num_attention_heads", "true", "field 'num_attention_heads': expected an integer, got a boolean"},
      {"num_key_value_heads", "{}", "field 'num_key_value_heads': expected an integer, got an object"},
      {"intermediate_size", "1e20", "field 'intermediate_size': 1e+20 is out of range"},
      {"head_dim", "\"128\"", "field 'head_dim': expected an integer, got a string"},
      {"max_position_embeddings", "\"4096\"", "field 'max_position_embeddings': expected an integer, got a string"},
      {"rms_norm_eps", "\"1e-6\"", "field 'rms_norm_eps': expected a number, got a string"},
      {"tie_word_embeddings", "1", "field 'tie_word_embeddings': expected a boolean, got 1"},
      {"attention_bias", "\"no\"", "field 'attention_bias': expected a boolean, got a string"},
      {"hidden_act", "1", "field 'hidden_act': expected a string, got 1"},
      {"dtype", "16", "field 'dtype': expected a string, got 16"},
      {"architectures", "\"Qwen3ForCausalLM\"", "field 'architectures': expected a list of strings, got a string"},
      {"architectures", "[3]", "field 'architectures': expected a string, got 3"},
      {"rope_parameters", "1e6", "field 'rope_parameters': expected an object, got a number"},
      {"rope_parameters", R"({"rope_theta":"big"})", "field 'rope_parameters.rope_theta': expected a number, got a string"},
      {"eos_token_id", "\"2\"", "field 'eos_token_id': expected an integer or a list of integers, got a string"},
      {"eos_token_id", "[2, \"3\"]", "field 'eos_token_id': expected an integer, got a string"},
      {"bos_token_id", "[1]", "field 'bos_token_id': expected an integer, got an array"},
  };
  for (const auto& [field, value, expected] : cases)
    EXPECT_EQ(load_error(dir, with(base_config(), field, value)), path + ": " + expected) << field << " = " << value;
  EXPECT_EQ(load_error(dir, Json::parse("[1]", "x")), path + ": expected a JSON object, got an array");
  EXPECT_EQ(load_error(dir, base_config(), R"({"eos_token_id": "x"})"),
            dir / "generation_config.json" + ": field 'eos_token_id': expected an integer or a list of integers, got a string");
}

TEST(Ch04_Config, InconsistentOrUnsupportedValuesAreRefused) {
  TempDir dir;
  const std::string path = dir / "config.json";
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"architectures", R"(["LlamaForCausalLM"])",
       "architectures is [\"LlamaForCausalLM\"]; only Qwen3ForCausalLM is supported"},
      {"hidden_size", "0", "field 'hidden_size' must be in [1, 16777216], got 0"},
      {"vocab_size", "-5", "field 'vocab_size' must be in [1, 16777216], got -5"},
      {"num_key_value_heads", "3", "num_attention_heads (4) must be a multiple of num_key_value_heads (3)"},
      {"head_dim", "15", "head_dim must be even for rotary embeddings, got 15"},
      {"max_position_embeddings", "0", "field 'max_position_embeddings' must be positive, got 0"},
      {"rms_norm_eps", "0", "field 'rms_norm_eps' must be positive, got 0"},
      // Finite as a double, +inf or 0 in the fp32 the norms add it in: every logit was 0, without an error.
      {"rms_norm_eps", "1e300", "field 'rms_norm_eps' is 1e+300, outside fp32's range, in which the norms add it"},
      {"rms_norm_eps", "1e-300", "field 'rms_norm_eps' is 1e-300, outside fp32's range, in which the norms add it"},
      {"rope_parameters", R"({"rope_theta":-1})", "rope_theta must be positive and finite, got -1"},
      // 1e400 reads as +inf: positive, but every angle would be 0 or NaN; named for what it is.
      {"rope_parameters", R"({"rope_theta":1e400})", "rope_theta must be positive and finite, got inf"},
      {"rope_parameters", R"({"rope_theta":1e6,"rope_type":"yarn","factor":4})",
       "field 'rope_parameters.rope_type' is 'yarn'; only default RoPE is supported"},
      // The older spelling is named as written (it was reported as 'rope_scaling.rope_type').
      {"rope_scaling", R"({"type":"linear","factor":2})", "field 'rope_scaling.type' is 'linear'; only default RoPE is supported"},
      // A factor with no type was run as plain RoPE.
      {"rope_scaling", R"({"factor":4.0,"original_max_position_embeddings":1024})",
       "field 'rope_scaling.factor' is given without a rope_type; only default RoPE is supported"},
      {"hidden_act", "\"gelu\"", "field 'hidden_act' is 'gelu'; Qwen3 uses 'silu'"},
      {"attention_bias", "true", "attention_bias is true; Qwen3 has no attention bias (it has q_norm/k_norm instead)"},
      {"use_sliding_window", "true", "use_sliding_window is true; sliding-window attention is not supported"},
      {"eos_token_id", "512", "field 'eos_token_id': token id 512 is outside the vocabulary [0, 512)"},
      {"eos_token_id", "[1, -1]", "field 'eos_token_id': token id -1 is outside the vocabulary [0, 512)"},
      {"dtype", "\"int8\"", "field 'dtype' is 'int8'; expected bfloat16, float16 or float32"},
      {"layer_types", R"(["full_attention"])", "field 'layer_types' must be a list of num_hidden_layers (2) entries"},
      {"layer_types", R"("full_attention")", "field 'layer_types' must be a list of num_hidden_layers (2) entries"},
      {"layer_types", R"(["full_attention", "linear_attention"])",
       "field 'layer_types' holds \"linear_attention\"; expected \"full_attention\" or \"sliding_attention\""},
  };
  for (const auto& [field, value, expected] : cases)
    EXPECT_EQ(load_error(dir, with(base_config(), field, value)), path + ": " + expected) << field << " = " << value;
  // The range is inclusive: 2^24 is a size, 2^24 + 1 is not.
  EXPECT_EQ(load(dir, with(base_config(), "vocab_size", "16777216")).vocab_size, 16777216);
  EXPECT_EQ(load_error(dir, with(base_config(), "vocab_size", "16777217")),
            path + ": field 'vocab_size' must be in [1, 16777216], got 16777217");
  // head_dim absent: 128 whatever hidden_size and the heads are (transformers' default).
  EXPECT_EQ(load(dir, with(with(without(base_config(), "head_dim"), "num_attention_heads", "6"), "num_key_value_heads", "3"))
                .head_dim,
            128);
  // What transformers would build another model for (model_type), or whose weights are not floats.
  EXPECT_EQ(load_error(dir, with(base_config(), "model_type", "\"qwen3_moe\"")),
            path + ": field 'model_type' is 'qwen3_moe'; only 'qwen3' is supported");
  EXPECT_EQ(load_error(dir, with(base_config(), "model_type", "3")), path + ": field 'model_type': expected a string, got 3");
  EXPECT_EQ(load(dir, without(base_config(), "model_type")).vocab_size, 512);  // absent: architectures decides
  EXPECT_EQ(load_error(dir, with(base_config(), "quantization_config", R"({"quant_method": "fp8", "weight_block_size": [128, 128]})")),
            path + ": field 'quantization_config' is present (quant_method 'fp8'); quantized checkpoints are not supported");
  EXPECT_EQ(load_error(dir, with(base_config(), "quantization_config", "{}")),
            path + ": field 'quantization_config' is present; quantized checkpoints are not supported");
  EXPECT_EQ(load(dir, with(base_config(), "quantization_config", "null")).vocab_size, 512);  // null is absent
  EXPECT_EQ(load_error(dir, base_config(), "{"), dir / "generation_config.json" + ":1:2: expected a string key in the object");
}

TEST(Ch04_Config, WriteConfigRoundTrips) {
  ModelConfig c;
  c.vocab_size = 151936;
  c.hidden_size = 1024;
  c.num_hidden_layers = 28;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 3072;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  c.dtype = "bfloat16";
  c.eos_token_ids = {151645, 151643};
  c.bos_token_id = 151643;
  TempDir dir;
  write_config(c, dir.path());
  ModelConfig back = ModelConfig::load(dir.path());
  EXPECT_EQ(back.vocab_size, c.vocab_size);
  EXPECT_EQ(back.hidden_size, c.hidden_size);
  EXPECT_EQ(back.num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(back.num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(back.num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(back.head_dim, c.head_dim);
  // 128 is also what load() assumes when head_dim is absent (transformers' default), so the equality above
  // would hold for a writer that left head_dim out: the loader must have found it in the file.
  EXPECT_FALSE(back.head_dim_absent) << "write_config left head_dim out";
  EXPECT_EQ(back.intermediate_size, c.intermediate_size);
  EXPECT_EQ(back.max_position_embeddings, c.max_position_embeddings);
  EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(back.rope_theta, c.rope_theta);
  EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings);
  EXPECT_EQ(back.dtype, c.dtype);
  EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(back.bos_token_id, c.bos_token_id);
  // transformers 5 layout, as Qwen's own files: config.json holds the first eos, generation_config the list.
  Json written = Json::parse(read_file(dir / "config.json"), "config.json");
  EXPECT_EQ(written.at("rope_parameters").at("rope_type").as_string(), "default");
  EXPECT_EQ(written.at("eos_token_id").as_int64(), 151645);
  ASSERT_NE(written.find("head_dim"), nullptr);
  EXPECT_EQ(written.at("head_dim").as_int64(), 128);
  EXPECT_EQ(written.at("architectures").dump(), "[\"Qwen3ForCausalLM\"]");
  EXPECT_EQ(Json::parse(read_file(dir / "generation_config.json"), "g").at("eos_token_id").dump(),
            "[151645,151643]");
}

TEST(Ch04_Config, Qwen3LayoutShapesAndParameterCounts) {
  ModelConfig c = ModelConfig::load(golden_dir("tiny-qwen3-b"));
  std::vector<TensorSpec> layout = qwen3_checkpoint_layout(c);
  ASSERT_EQ(layout.size(), 1u + 3 * 11 + 1 + 1);
  auto shape_of = [&](const std::string& name) {
    for (const TensorSpec& s : layout)
      if (s.name == name) return s.shape;
    return std::vector<int64_t>{-1};
  };
  // b: V 1000, H 96, I 192, 6 heads, 2 KV heads, head_dim 64 (so q width 384, kv width 128).
  EXPECT_EQ(shape_of("model.embed_tokens.weight"), (std::vector<int64_t>{1000, 96}));
  EXPECT_EQ(shape_of("model.layers.2.self_attn.q_proj.weight"), (std::vector<int64_t>{384, 96}));
  EXPECT_EQ(shape_of("model.layers.2.self_attn.k_proj.weight"), (std::vector<int64_t>{128, 96}));
  EXPECT_EQ(shape_of("model.layers.2.self_attn.v_proj.weight"), (std::vector<int64_t>{128, 96}));
  EXPECT_EQ(shape_of("model.layers.2.self_attn.o_proj.weight"), (std::vector<int64_t>{96, 384}));
  EXPECT_EQ(shape_of("model.layers.0.self_attn.q_norm.weight"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape_of("model.layers.0.self_attn.k_norm.weight"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape_of("model.layers.1.input_layernorm.weight"), (std::vector<int64_t>{96}));
  EXPECT_EQ(shape_of("model.layers.1.post_attention_layernorm.weight"), (std::vector<int64_t>{96}));
  EXPECT_EQ(shape_of("model.layers.1.mlp.gate_proj.weight"), (std::vector<int64_t>{192, 96}));
  EXPECT_EQ(shape_of("model.layers.1.mlp.up_proj.weight"), (std::vector<int64_t>{192, 96}));
  EXPECT_EQ(shape_of("model.layers.1.mlp.down_proj.weight"), (std::vector<int64_t>{96, 192}));
  EXPECT_EQ(shape_of("model.norm.weight"), (std::vector<int64_t>{96}));
  EXPECT_EQ(shape_of("lm_head.weight"), (std::vector<int64_t>{1000, 96}));
  EXPECT_EQ(shape_of("model.layers.3.input_layernorm.weight"), (std::vector<int64_t>{-1}));  // 3 layers only

  // b's count by hand: embed + head 2 * 96000; per layer q 36864 + k 12288 + v 12288 + o 36864 +
  // mlp 3 * 18432 + norms 96 + 96 + 64 + 64 = 153920; three layers 461760; final norm 96.
  EXPECT_EQ(parameter_count(c), 192000 + 461760 + 96);
  // A decode step reads b's untied embedding only by rows: the floor counts the LM head, not the table.
  EXPECT_EQ(decode_step_weight_bytes(c, 2), double(96000 + 461760 + 96) * 2);
  c.tie_word_embeddings = true;  // tied: one (1000, 96) table, read whole as the LM head
  EXPECT_EQ(decode_step_weight_bytes(c, 4), double(96000 + 461760 + 96) * 4);
}
