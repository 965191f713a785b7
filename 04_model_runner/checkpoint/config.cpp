// config.cpp: ModelConfig::load, write_config and the Qwen3 checkpoint layout.
#include "04_model_runner/checkpoint/config.h"

#include <climits>
#include <cmath>

#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"
#include "01_sequence/base/json.h"

namespace nanovllm {

namespace {

// Typed access to the fields of one JSON object, with errors "PATH: field 'NAME': expected ...".
// An optional field set to null counts as absent, as transformers treats it (e.g. "pad_token_id": null); a
// required one set to null is a type error ("expected an integer, got null").
class FieldReader {
 public:
  // `group` names a nested object ("rope_parameters"), so that errors say 'rope_parameters.rope_theta'.
  FieldReader(const Json& object, std::string path, const std::string& group = "")
      : object_(object), path_(std::move(path)), prefix_(group.empty() ? "" : group + ".") {
    if (object.is_object()) return;
    if (group.empty()) fail(path_, ": expected a JSON object, got ", Json::type_name(object.type()));
    fail(path_, ": field '", group, "': expected an object, got ", Json::type_name(object.type()));
  }
  const std::string& path() const { return path_; }

  const Json* optional(const std::string& name) const {
    const Json* value = object_.find(name);
    return value && !value->is_null() ? value : nullptr;
  }
  const Json& required(const std::string& name) const {
    const Json* value = object_.find(name);
    if (!value) fail(path_, ": missing field '", prefix_, name, "'");
    return *value;
  }

  // An integer in [INT_MIN, INT_MAX]: 128 or 128.0, but not 1.5 or "128".
  int as_int(const std::string& name, const Json& value) const {
    if (!value.is_number() || (!value.is_integer() && value.as_double() != std::floor(value.as_double())))
      type_error(name, "an integer", value);
    if (value.as_double() < INT_MIN || value.as_double() > INT_MAX)
      fail(path_, ": field '", prefix_, name, "': ", value.dump(), " is out of range");
    return int(value.as_int64());
  }
  double as_number(const std::string& name, const Json& value) const {
    if (!value.is_number()) type_error(name, "a number", value);
    return value.as_double();
  }
  bool as_bool(const std::string& name, const Json& value) const {
    if (value.type() != Json::Type::Bool) type_error(name, "a boolean", value);
    return value.as_bool();
  }
  const std::string& as_string(const std::string& name, const Json& value) const {
    if (!value.is_string()) type_error(name, "a string", value);
    return value.as_string();
  }

  // A required size: an integer in [1, 2^24]. The upper bound keeps every product the engine forms
  // from two sizes (heads * head_dim, vocab * hidden) far from overflow; real models are far below it.
  int size(const std::string& name) const { return check_size(name, as_int(name, required(name))); }
  int check_size(const std::string& name, int value) const {
    if (value < 1 || value > (1 << 24))
      fail(path_, ": field '", prefix_, name, "' must be in [1, 16777216], got ", value);
    return value;
  }

  [[noreturn]] void type_error(const std::string& name, const char* expected, const Json& got) const {
    fail(path_, ": field '", prefix_, name, "': expected ", expected, ", got ",
         got.is_number() ? got.dump() : std::string(Json::type_name(got.type())));
  }

 private:
  const Json& object_;
  std::string path_;
  std::string prefix_;
};

// eos_token_id: an integer or a list of integers (Qwen3's generation_config.json lists two).
std::vector<int> read_token_ids(const FieldReader& reader, const std::string& name, const Json& value,
                                int vocab_size) {
  std::vector<int> ids;
  if (value.is_array()) {
    for (const Json& id : value.as_array()) ids.push_back(reader.as_int(name, id));
  } else if (value.is_number()) {
    ids.push_back(reader.as_int(name, value));
  } else {
    reader.type_error(name, "an integer or a list of integers", value);
  }
  for (int id : ids)
    if (id < 0 || id >= vocab_size)
      fail(reader.path(), ": field '", name, "': token id ", id, " is outside the vocabulary [0, ", vocab_size, ")");
  return ids;
}

// A JSON object written one member per line, as Hugging Face writes its configs (values compact).
std::string pretty_object(const Json& object) {
  std::string out = "{\n";
  const auto& members = object.as_object();
  for (size_t i = 0; i < members.size(); i++) {
    out += "  ";
    json_append_quoted(out, members[i].first);
    out += ": " + members[i].second.dump() + (i + 1 < members.size() ? ",\n" : "\n");
  }
  return out + "}\n";
}

}  // namespace

ModelConfig ModelConfig::load(const std::string& model_dir) {
  check_model_folder(model_dir);
  const std::string path = model_dir + "/config.json";
  const Json root = Json::parse(read_file(path, kConfigFile), path);
  const FieldReader config(root, path);
  ModelConfig c;

  // Qwen3 only: other architectures have other layouts and numerics.
  const Json& architectures = config.required("architectures");
  if (!architectures.is_array()) config.type_error("architectures", "a list of strings", architectures);
  bool is_qwen3 = false;
  for (const Json& a : architectures.as_array())
    is_qwen3 |= config.as_string("architectures", a) == "Qwen3ForCausalLM";
  if (!is_qwen3)
    fail(path, ": architectures is ", architectures.dump(), "; only Qwen3ForCausalLM is supported");
  // transformers builds the config class model_type names (qwen3_moe's has experts that the layout below
  // does not read), and a quantized checkpoint's weights are not the floats this loader reads.
  if (const Json* type = config.optional("model_type"); type && config.as_string("model_type", *type) != "qwen3")
    fail(path, ": field 'model_type' is '", type->as_string(), "'; only 'qwen3' is supported");
  if (const Json* quantization = config.optional("quantization_config")) {
    const Json* method = quantization->find("quant_method");
    fail(path, ": field 'quantization_config' is present",
         method && method->is_string() ? " (quant_method '" + method->as_string() + "')" : std::string(),
         "; quantized checkpoints are not supported");
  }

  c.vocab_size = config.size("vocab_size");
  c.hidden_size = config.size("hidden_size");
  c.num_hidden_layers = config.size("num_hidden_layers");
  c.num_attention_heads = config.size("num_attention_heads");
  c.num_key_value_heads = config.size("num_key_value_heads");
  c.intermediate_size = config.size("intermediate_size");
  c.max_position_embeddings = config.as_int("max_position_embeddings", config.required("max_position_embeddings"));
  if (c.max_position_embeddings < 1)
    fail(path, ": field 'max_position_embeddings' must be positive, got ", c.max_position_embeddings);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(path, ": num_attention_heads (", c.num_attention_heads, ") must be a multiple of num_key_value_heads (",
         c.num_key_value_heads, ")");
  // head_dim: Qwen3 sets it (128, independent of hidden_size). Without it, 128 too: transformers' Qwen3Config
  // has that default, so transformers, and nano-vllm, which reads config.json through it, use 128 (not
  // hidden_size / num_attention_heads, nano-vllm's fallback for a config object with no head_dim at all).
  if (const Json* head_dim = config.optional("head_dim")) {
    c.head_dim = config.check_size("head_dim", config.as_int("head_dim", *head_dim));
  } else {
    c.head_dim = kDefaultHeadDim;
    c.head_dim_absent = true;
  }
  if (c.head_dim % 2 != 0) fail(path, ": head_dim must be even for rotary embeddings, got ", c.head_dim);

  c.rms_norm_eps = config.as_number("rms_norm_eps", config.required("rms_norm_eps"));
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    fail(path, ": field 'rms_norm_eps' must be positive, got ", c.rms_norm_eps);
  // The norms add it in fp32: past FLT_MAX it is +inf there and every normed value 0 (logits all 0, no error);
  // below fp32's smallest it is 0 there and an all-zero row divides by 0.
  if (!std::isfinite(float(c.rms_norm_eps)) || !(float(c.rms_norm_eps) > 0))
    fail(path, ": field 'rms_norm_eps' is ", c.rms_norm_eps, ", outside fp32's range, in which the norms add it");

  // RoPE base. transformers 4 writes "rope_theta" (and "rope_scaling": null); transformers 5 writes
  // "rope_parameters": {"rope_theta": ..., "rope_type": "default"}; some versions in between put the
  // theta inside "rope_scaling". The nested value wins. Scaled RoPE (yarn, linear, ...) is not
  // implemented, and ignoring it would silently give wrong text, so it is refused.
  bool have_theta = false;
  if (const Json* theta = config.optional("rope_theta")) {
    c.rope_theta = config.as_number("rope_theta", *theta);
    have_theta = true;
  }
  for (const char* group_name : {"rope_parameters", "rope_scaling"}) {
    const Json* group = config.optional(group_name);
    if (!group) continue;
    const FieldReader rope(*group, path, group_name);
    // The key as the file spells it ("rope_type", or the older "type"), so that the error names what is there.
    const char* type_key = rope.optional("rope_type") ? "rope_type" : "type";
    const Json* type = rope.optional(type_key);
    if (type && rope.as_string(type_key, *type) != "default")
      fail(path, ": field '", group_name, ".", type_key, "' is '", type->as_string(), "'; only default RoPE is supported");
    // A scaling factor with no type says scaled RoPE without saying which: refused, as a named type is.
    if (!type && rope.optional("factor"))
      fail(path, ": field '", group_name, ".factor' is given without a rope_type; only default RoPE is supported");
    if (const Json* theta = rope.optional("rope_theta")) {
      c.rope_theta = rope.as_number("rope_theta", *theta);
      have_theta = true;
    }
  }
  if (!have_theta) fail(path, ": missing field 'rope_parameters.rope_theta' (or 'rope_theta')");
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail(path, ": rope_theta must be positive and finite, got ", c.rope_theta);
  // Every angle of the RoPE table (build_rope_table: position x 1 / theta^(2 j / head_dim), in fp32) must be
  // finite, or each step's logits come out NaN and the weights get the blame: a theta of 1e-320 passes the
  // test above.
  for (int j = 0; j < c.head_dim / 2; j++) {
    const float inv_freq = 1.0f / float(std::pow(c.rope_theta, double(2 * j) / c.head_dim));
    if (!std::isfinite(inv_freq) || !std::isfinite(float(c.max_position_embeddings - 1) * inv_freq))
      fail(path, ": rope_theta ", c.rope_theta, " gives RoPE angles that overflow fp32 (head_dim ", c.head_dim,
           ", max_position_embeddings ", c.max_position_embeddings, ")");
  }

  if (const Json* tie = config.optional("tie_word_embeddings"))
    c.tie_word_embeddings = config.as_bool("tie_word_embeddings", *tie);
  if (const Json* act = config.optional("hidden_act"); act && config.as_string("hidden_act", *act) != "silu")
    fail(path, ": field 'hidden_act' is '", act->as_string(), "'; Qwen3 uses 'silu'");
  if (const Json* bias = config.optional("attention_bias"); bias && config.as_bool("attention_bias", *bias))
    fail(path, ": attention_bias is true; Qwen3 has no attention bias (it has q_norm/k_norm instead)");
  if (const Json* sliding = config.optional("use_sliding_window");
      sliding && config.as_bool("use_sliding_window", *sliding))
    fail(path, ": use_sliding_window is true; sliding-window attention is not supported");
  for (const char* name : {"dtype", "torch_dtype"}) {  // 5.x name first
    const Json* dtype = config.optional(name);
    if (!dtype || !c.dtype.empty()) continue;
    c.dtype = config.as_string(name, *dtype);
    // The checkpoint's weights are read as they are stored (safetensors names each tensor's dtype); this
    // is what the model was trained in, and anything but a float type means a model this engine is not.
    if (c.dtype != "bfloat16" && c.dtype != "float16" && c.dtype != "float32")
      fail(path, ": field '", name, "' is '", c.dtype, "'; expected bfloat16, float16 or float32");
  }
  // Which layers use sliding-window attention: none may here (use_sliding_window is false above), and
  // transformers refuses a list of the wrong length or with another kind of layer.
  if (const Json* kinds = config.optional("layer_types")) {
    if (!kinds->is_array() || int64_t(kinds->size()) != c.num_hidden_layers)
      fail(path, ": field 'layer_types' must be a list of num_hidden_layers (", c.num_hidden_layers, ") entries");
    for (const Json& kind : kinds->as_array())
      if (!kind.is_string() || (kind.as_string() != "full_attention" && kind.as_string() != "sliding_attention"))
        fail(path, ": field 'layer_types' holds ", kind.dump(), "; expected \"full_attention\" or \"sliding_attention\"");
  }

  // Special tokens: generation_config.json, when present, is what generate() uses.
  const std::string gen_path = model_dir + "/generation_config.json";
  Json gen_root = Json::object();
  if (optional_file_exists(gen_path)) gen_root = Json::parse(read_file(gen_path, kConfigFile), gen_path);
  const FieldReader generation(gen_root, gen_path);
  for (const FieldReader* source : {&generation, &config}) {
    if (const Json* eos = source->optional("eos_token_id")) {
      c.eos_token_ids = read_token_ids(*source, "eos_token_id", *eos, c.vocab_size);
      break;
    }
  }
  for (const FieldReader* source : {&generation, &config}) {
    if (const Json* bos = source->optional("bos_token_id")) {
      if (!bos->is_number()) source->type_error("bos_token_id", "an integer", *bos);
      c.bos_token_id = read_token_ids(*source, "bos_token_id", *bos, c.vocab_size).at(0);
      break;
    }
  }
  return c;
}

void write_config(const ModelConfig& c, const std::string& dir) {
  // Keys in the alphabetical order transformers writes them.
  Json config = Json::object();
  Json architectures = Json::array();
  architectures.push_back("Qwen3ForCausalLM");
  config.set("architectures", std::move(architectures));
  config.set("attention_bias", false);
  config.set("attention_dropout", 0.0);
  if (c.bos_token_id >= 0) config.set("bos_token_id", c.bos_token_id);
  config.set("dtype", c.dtype.empty() ? "bfloat16" : c.dtype);
  if (!c.eos_token_ids.empty()) config.set("eos_token_id", c.eos_token_ids[0]);  // the list: below
  config.set("head_dim", c.head_dim);
  config.set("hidden_act", "silu");
  config.set("hidden_size", c.hidden_size);
  config.set("intermediate_size", c.intermediate_size);
  config.set("max_position_embeddings", c.max_position_embeddings);
  config.set("model_type", "qwen3");
  config.set("num_attention_heads", c.num_attention_heads);
  config.set("num_hidden_layers", c.num_hidden_layers);
  config.set("num_key_value_heads", c.num_key_value_heads);
  config.set("rms_norm_eps", c.rms_norm_eps);
  Json rope = Json::object();
  rope.set("rope_theta", c.rope_theta);
  rope.set("rope_type", "default");
  config.set("rope_parameters", std::move(rope));
  config.set("tie_word_embeddings", c.tie_word_embeddings);
  config.set("use_cache", true);
  config.set("use_sliding_window", false);
  config.set("vocab_size", c.vocab_size);
  write_file(dir + "/config.json", pretty_object(config));

  // generation_config.json holds the full eos list (Qwen3: [151645, 151643]), as Qwen's own files do.
  Json generation = Json::object();
  if (c.bos_token_id >= 0) generation.set("bos_token_id", c.bos_token_id);
  if (c.eos_token_ids.size() == 1) {
    generation.set("eos_token_id", c.eos_token_ids[0]);
  } else if (!c.eos_token_ids.empty()) {
    Json ids = Json::array();
    for (int id : c.eos_token_ids) ids.push_back(id);
    generation.set("eos_token_id", std::move(ids));
  }
  write_file(dir + "/generation_config.json", pretty_object(generation));
}

std::vector<TensorSpec> qwen3_checkpoint_layout(const ModelConfig& c) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_width = int64_t(c.num_attention_heads) * D, kv_width = int64_t(c.num_key_value_heads) * D;
  std::vector<TensorSpec> layout = {{"model.embed_tokens.weight", {V, H}}};
  for (int i = 0; i < c.num_hidden_layers; i++) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    layout.push_back({p + "input_layernorm.weight", {H}});
    layout.push_back({p + "self_attn.q_proj.weight", {q_width, H}});
    layout.push_back({p + "self_attn.k_proj.weight", {kv_width, H}});
    layout.push_back({p + "self_attn.v_proj.weight", {kv_width, H}});
    layout.push_back({p + "self_attn.o_proj.weight", {H, q_width}});
    layout.push_back({p + "self_attn.q_norm.weight", {D}});
    layout.push_back({p + "self_attn.k_norm.weight", {D}});
    layout.push_back({p + "post_attention_layernorm.weight", {H}});
    layout.push_back({p + "mlp.gate_proj.weight", {I, H}});
    layout.push_back({p + "mlp.up_proj.weight", {I, H}});
    layout.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  layout.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) layout.push_back({"lm_head.weight", {V, H}});
  return layout;
}

int64_t parameter_count(const ModelConfig& config) {
  int64_t total = 0;
  for (const TensorSpec& spec : qwen3_checkpoint_layout(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    total += n;
  }
  return total;
}

double decode_step_weight_bytes(const ModelConfig& config, int bytes_per_weight) {
  const int64_t embedding = config.tie_word_embeddings ? 0 : int64_t(config.vocab_size) * config.hidden_size;
  return double(parameter_count(config) - embedding) * bytes_per_weight;
}

}  // namespace nanovllm
