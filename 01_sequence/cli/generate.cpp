// generate.cpp: the subcommands that run the model, `generate` and `logits` (nano-vllm: example.py).
//
//   nanovllm generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3 | --requests FILE)... [sampling]
//                     [engine options] [--json]
//   nanovllm logits   --model DIR --prompt-ids 1,2,3
//
// Part of the entry (linked last): it builds an LLMEngine from flags.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iostream>

#include "01_sequence/base/files.h"
#include "01_sequence/base/log.h"
#include "01_sequence/cli/flags.h"
#include "01_sequence/base/json.h"
#include "01_sequence/llm_engine.h"
#include "02_scheduler/scheduler.h"
#include "01_sequence/tokenizer/chat_template.h"
#include "01_sequence/tokenizer/tokenizer.h"
#include "01_sequence/base/utf8.h"
#include "04_model_runner/model_runner.h"
#include "04_model_runner/checkpoint/random_model.h"

namespace nanovllm {

namespace {

// "1,2,3" -> {1, 2, 3}: plain decimal ids, nothing else ("1,2,", "1, 2" and "+1" are refused).
std::vector<int32_t> parse_ids(const std::string& text) {
  if (text.empty()) throw UsageError("--prompt-ids is empty");
  std::vector<int32_t> ids;
  for (size_t start = 0;; start++) {
    const size_t end = std::min(text.find(',', start), text.size());
    int64_t v = -1;
    auto [stop, ec] = std::from_chars(text.data() + start, text.data() + end, v);
    // Digits only, and no leading zero but in "0" itself: from_chars would also take "-0" and "007".
    const bool plain = end > start && text[start] >= '0' && text[start] <= '9' && (text[start] != '0' || end == start + 1);
    if (!plain || ec != std::errc() || stop != text.data() + end || v > INT32_MAX)
      throw UsageError("--prompt-ids expects comma-separated token ids, got '" + text + "'");
    ids.push_back(int32_t(v));
    if ((start = end) == text.size()) break;
  }
  return ids;
}

// Without --model, `generate` runs on an embedded default: a tiny Qwen3 with random weights and the
// real Qwen3 tokenizer, written under build/data the first time (safely when several runs start at
// once, see ensure_random_model). Its text is gibberish, but every part of the engine runs on it.
std::string default_model() {
  const std::string dir = data_dir() + "/tiny-random-qwen3";
  if (!is_complete_random_model(dir, /*with_tokenizer=*/true))
    std::fprintf(stderr, "no --model given: writing a tiny random-weight Qwen3 to %s\n", dir.c_str());
  ensure_random_model("tiny", dir, 0, data_dir() + "/qwen3-tokenizer");
  return dir;
}

// The engine's settings from the flags, every value checked (a UsageError names the flag). Without --model, where
// `default_allowed`, `model` is left empty for the caller to fill with default_model(), which may write it.
EngineConfig engine_config_from(const Flags& f, bool default_allowed) {
  EngineConfig c;
  for (const char* name : {"model", "tokenizer"})
    if (f.has(name) && f.get(name).empty()) throw UsageError(std::string("--") + name + " expects a folder, got ''");
  c.model = f.get("model");
  if (c.model.empty() && !default_allowed) throw UsageError("--model DIR is required");
  c.tokenizer = f.get("tokenizer");
  c.device = device_from(f);
  c.max_num_seqs = int(f.get_int("max-num-seqs", c.max_num_seqs, 1, 1 << 20));
  c.max_num_batched_tokens = int(f.get_int("max-num-batched-tokens", c.max_num_batched_tokens, 1, 1 << 24));
  c.max_model_len = int(f.get_int("max-model-len", c.max_model_len, 1, 1 << 24));
  c.gpu_memory_utilization = float(f.get_double("gpu-memory-utilization", c.gpu_memory_utilization, 0.01, 1.0));
  c.cpu_memory_mib = int(f.get_int("cpu-memory-mib", c.cpu_memory_mib, 1, 1 << 24));
  c.attention_version = attention_version_from(f);
  c.linear_version = linear_version_from(f);
  c.collectives = collectives_from(f);
  c.kvcache_block_size = block_size_from(f, c.kvcache_block_size);
  c.num_kvcache_blocks = int(f.get_int("kv-cache-blocks", -1, 1, 1 << 30));
  if (!f.has("kv-cache-blocks")) c.num_kvcache_blocks = -1;
  c.tensor_parallel_size = int(f.get_int("tensor-parallel-size", 1, 1, 8));
  c.enforce_eager = f.has("enforce-eager");
  c.trace = f.has("trace");
  c.overlap_steps = !f.has("no-overlap");
  c.seed = f.get_uint64("seed", 0);
  return c;
}

SamplingParams sampling_from(const Flags& f) {
  SamplingParams p;
  // The ranges the flags accept, so that a value past them is named with them (--max-tokens 2147483648 said
  // "must be in [-2147483648, 2147483647]", and -1 is refused); top_p's open end at 0 is validate()'s.
  p.temperature = float(f.get_double("temperature", p.temperature, 0, 1e30));
  p.max_tokens = int(f.get_int("max-tokens", p.max_tokens, 1, INT32_MAX));
  p.top_k = int(f.get_int("top-k", p.top_k, 0, INT32_MAX));
  p.top_p = float(f.get_double("top-p", p.top_p, 0, 1, /*open_low=*/true));
  if (p.top_p == 0) throw UsageError("--top-p " + f.get("top-p") + " is 0 as a 32-bit float, outside (0, 1]");
  p.ignore_eos = f.has("ignore-eos");
  try {
    p.validate();  // "temperature must be >= 0 ...", naming the value
  } catch (const Error& e) {
    throw UsageError(e.what());  // an option's value: exit 2, as every usage error
  }
  return p;
}

// One request to generate: its prompt, as text (after the chat template, if any) or as token ids, its own
// sampling parameters, and, for one read from a --requests file, where it was given ("requests.jsonl line 7").
struct Request {
  std::string text;  // to tokenize; empty when the ids were given
  std::vector<int32_t> ids;
  bool is_text = false;
  SamplingParams params;
  std::string origin;     // empty for a request of the command line itself
  bool messages = false;  // given as chat messages (a --requests line's "messages")
};

// A JSON number as a value of [lo, hi], naming the field when it is not one ("max_tokens: expected an integer in
// [1, 2147483647], got 0.5").
int64_t integer_field(const Json& value, const char* field, int64_t lo, int64_t hi) {
  if (!value.is_integer() || value.as_int64() < lo || value.as_int64() > hi)
    fail(field, ": expected an integer in [", lo, ", ", hi, "], got ", value.dump());
  return value.as_int64();
}

// A JSON number in [lo, hi] (or (lo, hi] when `open_low`), as the float SamplingParams holds. The range is the
// flag's (--temperature, --top-p), checked on the number as written, so that 1e308 is not "inf" and -1e-300 not
// 0; a positive number no float holds is named too, rather than read as 0.
float float_field(const Json& value, const char* field, double lo, double hi, bool open_low) {
  const bool in_range = value.is_number() && (open_low ? value.as_double() > lo : value.as_double() >= lo) &&
                        value.as_double() <= hi;
  if (!in_range)
    fail(field, ": expected a number in ", open_low ? "(" : "[", lo, ", ", hi, "], got ", value.dump());
  const float f = float(value.as_double());
  if (open_low && f <= float(lo)) fail(field, ": ", value.dump(), " is ", f, " as a 32-bit float, outside (", lo, ", ", hi, "]");
  return f;
}

// One line of a --requests file (JSON Lines): nano-vllm's generate(prompts, sampling_params) with a
// SamplingParams of its own for each prompt. The prompt is exactly one of
//   "prompt": "text"                  (wrapped in the chat template as one user turn under --chat, as --prompt)
//   "prompt_token_ids": [1, 2, 3]     (as --prompt-ids)
//   "messages": [{"role": "user", "content": "..."}, ...], with "enable_thinking": false if wanted (rendered by
//                                     Qwen3's chat template, its generation prompt added, as the chat-template command)
// and any of "max_tokens", "temperature", "top_k", "top_p", "ignore_eos" and "seed" override the command line's
// --max-tokens ... --ignore-eos for this request ("seed" is the request's own, SamplingParams::seed). Any other
// field, or one given twice, is refused rather than ignored: "max_token" would otherwise be a silent default.
//
// `chat` is --chat; `thinking` is false under --no-thinking, for "prompt" under --chat and for "messages" without
// an "enable_thinking" of their own.
Request parse_request_line(const Json& line, const SamplingParams& defaults, bool chat, bool thinking) {
  if (!line.is_object())
    fail("expected a request object {\"prompt\": ...}, got ", Json::type_name(line.type()));
  check_fields(line, {"prompt", "prompt_token_ids", "messages", "enable_thinking", "max_tokens", "temperature", "top_k",
                      "top_p", "ignore_eos", "seed"}, "a request");
  const int prompts = int(line.find("prompt") != nullptr) + int(line.find("prompt_token_ids") != nullptr) +
                      int(line.find("messages") != nullptr);
  if (prompts != 1) fail("give exactly one of \"prompt\", \"prompt_token_ids\" and \"messages\", got ", prompts);
  if (line.find("enable_thinking") && !line.find("messages")) fail("\"enable_thinking\" applies to \"messages\"");

  Request r;
  if (const Json* text = line.find("prompt")) {
    if (!text->is_string()) fail("prompt: expected a string, got ", Json::type_name(text->type()));
    r.is_text = true;
    r.text = chat ? apply_chat_template({{"user", text->as_string()}}, true, thinking) : text->as_string();
  } else if (const Json* ids = line.find("prompt_token_ids")) {
    if (chat) fail("--chat applies to text prompts, not to \"prompt_token_ids\"");
    if (!ids->is_array() || ids->as_array().empty())
      fail("prompt_token_ids: expected a non-empty array of token ids, got ", ids->is_array() ? "[]" : Json::type_name(ids->type()));
    for (size_t i = 0; i < ids->size(); i++) {
      const std::string field = "prompt_token_ids[" + std::to_string(i) + "]";
      r.ids.push_back(int32_t(integer_field(ids->as_array()[i], field.c_str(), 0, INT32_MAX)));
    }
  } else {
    const std::vector<ChatMessage> messages = parse_chat_messages(line.at("messages"));  // "messages[1].role: ..."
    bool enable_thinking = thinking;  // the template's default, true, unless --no-thinking
    if (const Json* v = line.find("enable_thinking")) {
      if (v->type() != Json::Type::Bool) fail("enable_thinking: expected true or false, got ", v->dump());
      enable_thinking = v->as_bool();
    }
    r.is_text = r.messages = true;
    r.text = apply_chat_template(messages, /*add_generation_prompt=*/true, enable_thinking);
  }

  r.params = defaults;
  if (const Json* v = line.find("max_tokens")) r.params.max_tokens = int(integer_field(*v, "max_tokens", 1, INT32_MAX));
  if (const Json* v = line.find("top_k")) r.params.top_k = int(integer_field(*v, "top_k", 0, INT32_MAX));
  if (const Json* v = line.find("temperature")) r.params.temperature = float_field(*v, "temperature", 0, 1e30, false);
  if (const Json* v = line.find("top_p")) r.params.top_p = float_field(*v, "top_p", 0, 1, true);
  if (const Json* v = line.find("ignore_eos")) {
    if (v->type() != Json::Type::Bool) fail("ignore_eos: expected true or false, got ", v->dump());
    r.params.ignore_eos = v->as_bool();
  }
  if (const Json* v = line.find("seed")) {
    try {
      r.params.seed = v->as_uint64();  // an integer as written, exact in [0, 2^64)
    } catch (const Error&) {
      fail("seed: expected an integer in [0, 2^64), got ", v->dump());
    }
  }
  r.params.validate();  // "temperature must be >= 0 (0 = greedy), got -1"
  return r;
}

// How many requests, and bytes of them, a run may still read: 2^20 requests (each costs the engine about a
// kilobyte, however short) and 1 GiB (what a file read whole may hold), over every --requests of the run, so
// that a stream that never ends (`yes '{"prompt": "x"}'`) stops there rather than filling the memory.
struct RequestsLeft {
  size_t requests = size_t(1) << 20;
  long long bytes = kAnyFile.bytes;
};

// The requests of `path` (JSON Lines; "-" reads stdin), one a non-blank line, each line's errors prefixed with
// "PATH line N: ". Read before the model is loaded, so that a mistake in line 900 costs no loading, and parsed
// line by line as they are read.
std::vector<Request> read_requests(const std::string& path, const SamplingParams& defaults, bool chat, bool thinking,
                                   RequestsLeft& left) {
  LineReader in = path == "-" ? LineReader() : LineReader(path);  // "PATH: cannot read: ..."
  std::vector<Request> requests;
  for (std::string text; in.next(text);) {
    if ((left.bytes -= (long long)text.size() + 1) < 0)
      fail(in.name(), " line ", in.line_number(), ": more than ", kAnyFile.bytes >> 30, " GiB of requests in the run");
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines separate, as in JSON Lines files
    if (left.requests-- == 0)
      fail(in.name(), " line ", in.line_number(), ": more than ", RequestsLeft().requests, " requests in the run");
    const std::string origin = in.name() + " line " + std::to_string(in.line_number());
    const Json line = Json::parse_line(text, origin);  // its errors start with the origin
    try {
      requests.push_back(parse_request_line(line, defaults, chat, thinking));
    } catch (const Error& e) {
      fail(origin, ": ", e.what());
    }
    requests.back().origin = origin;
  }
  if (requests.empty()) fail(in.name(), ": no requests (one JSON object a line, such as {\"prompt\": \"introduce yourself\"})");
  return requests;
}

}  // namespace

int cmd_generate(const Flags& flags) {
  const SamplingParams params = sampling_from(flags);
  const bool chat = flags.has("chat"), thinking = !flags.has("no-thinking");
  if (!flags.has("prompt") && !flags.has("prompt-ids") && !flags.has("requests"))
    throw UsageError("give at least one --prompt, --prompt-ids or --requests");
  if (chat && flags.has("prompt-ids")) throw UsageError("--chat applies to --prompt TEXT, not to --prompt-ids");
  const std::vector<std::string>& files = flags.get_all("requests");
  if (std::count(files.begin(), files.end(), "-") > 1) throw UsageError("--requests - (stdin) given twice");
  // The flags first, and a model's config.json: a usage error or a missing model is told at once, not after
  // stdin's requests have been read.
  EngineConfig config = engine_config_from(flags, /*default_allowed=*/true);
  if (!config.model.empty()) ModelConfig::load(config.model);  // "DIR/config.json: cannot read: ..."

  // The requests in command-line order, read and checked before the model is loaded. --chat wraps each text
  // prompt in Qwen3's chat template as one user turn (nano-vllm's example.py), thinking enabled as the
  // template's default, or, under --no-thinking, with the template's empty thought ("<think>\n\n</think>"),
  // which Qwen3's hybrid models read as "answer without reasoning".
  std::vector<Request> requests;
  RequestsLeft left;
  bool templated = chat;  // is Qwen3's chat template rendered for any request?
  for (const auto& [name, value] : flags.in_order()) {
    if (name == "prompt-ids") {
      requests.push_back({"", parse_ids(value), false, params, ""});
    } else if (name == "prompt") {
      // Checked here, so that the error names the prompt and the offset in it as given (not in the chat
      // template around it).
      check_utf8(value, "request " + std::to_string(requests.size()) + " (--prompt)");
      requests.push_back({chat ? apply_chat_template({{"user", value}}, true, thinking) : value, {}, true, params, ""});
    } else if (name == "requests") {
      for (Request& r : read_requests(value, params, chat, thinking, left)) requests.push_back(std::move(r));
    }
  }
  for (const Request& r : requests) templated = templated || r.messages;  // rendered by the template too
  if (!thinking && !templated)
    throw UsageError("--no-thinking applies to prompts rendered by the chat template: give --chat, or \"messages\" in --requests");
  const auto first_text = std::find_if(requests.begin(), requests.end(), [](const Request& r) { return r.is_text; });

  if (config.model.empty()) config.model = default_model();  // written now, once the requests are known to be good
  // Before the model is loaded: a tokenizer folder whose chat template is not Qwen3's fails at once.
  const std::string tokenizer_dir = config.tokenizer.empty() ? config.model : config.tokenizer;
  if (templated && optional_file_exists(tokenizer_dir + "/tokenizer.json")) check_chat_template(tokenizer_dir);
  LLMEngine engine(config);
  note_a_cut_max_model_len(flags, engine.config().max_model_len);
  const Tokenizer* tokenizer = engine.tokenizer();
  if (first_text != requests.end() && !tokenizer)
    fail(first_text->origin.empty() ? "--prompt TEXT" : first_text->origin + ": a text prompt", " needs a tokenizer: ",
         engine.config().model, " has no tokenizer.json (give --tokenizer DIR)");
  // Each request queued by itself, so that the engine's refusal of one read from a file names its line
  // ("stdin line 2: request 1: token id 5000 is outside the vocabulary [0, 512)"); then generate()'s loop.
  std::vector<int64_t> ids;
  for (const Request& r : requests) {
    try {
      ids.push_back(engine.add_request(r.is_text ? tokenizer->encode(r.text) : r.ids, r.params));
    } catch (const Error& e) {
      if (r.origin.empty()) throw;
      fail(r.origin, ": ", e.what());
    }
  }
  const std::vector<GenerateOutput> outputs = engine.run_to_completion(ids, /*progress=*/true);

  for (size_t i = 0; i < outputs.size(); i++) {
    const GenerateOutput& out = outputs[i];
    if (flags.has("json")) {
      Json line = Json::object();
      line.set("index", int64_t(i));
      Json prompt_ids = Json::array(), token_ids = Json::array();
      for (int32_t t : out.prompt_token_ids) prompt_ids.push_back(t);
      for (int32_t t : out.token_ids) token_ids.push_back(t);
      line.set("prompt_token_ids", prompt_ids);
      line.set("token_ids", token_ids);
      if (tokenizer) line.set("text", out.text);
      write_stdout(line.dump() + "\n");
    } else if (tokenizer) {  // as nano-vllm's example.py: the prompt and the completion, quoted
      std::string prompt = requests[i].is_text ? requests[i].text : tokenizer->decode(out.prompt_token_ids, true);
      std::string line = "Prompt: ";
      json_append_quoted(line, prompt);
      line += "\nCompletion: ";
      json_append_quoted(line, out.text);
      write_stdout(line + "\n");
    } else {
      std::string line = "Prompt " + std::to_string(i) + ": " + counted(out.prompt_token_ids.size(), "token") +
                         "\nCompletion " + std::to_string(i) + ":";
      for (int32_t t : out.token_ids) line += " " + std::to_string(t);
      write_stdout(line + "\n");
    }
  }
  const EngineStats& s = engine.stats();
  std::fprintf(stderr, "%s: %s computed in %s (%.0f tok/s), %s in %s (%.0f tok/s)\n",
               counted(int64_t(outputs.size()), "request").c_str(), counted(s.prefill_tokens, "token").c_str(),
               counted(s.prefill_steps, "prefill step").c_str(),
               s.prefill_seconds > 0 ? s.prefill_tokens / s.prefill_seconds : 0.0,
               counted(s.decode_tokens, "decode token").c_str(), counted(s.decode_steps, "step").c_str(),
               s.decode_seconds > 0 ? s.decode_tokens / s.decode_seconds : 0.0);
  const std::vector<int64_t>& rank_steps = engine.model_runner().rank_steps();
  if (rank_steps.size() > 1) {  // every rank ran every step: the proof that the ranks worked together
    std::string steps;
    for (int64_t n : rank_steps) steps += " " + std::to_string(n);
    log("tensor parallel: %zu ranks, steps run by each:%s", rank_steps.size(), steps.c_str());
  }
  if (engine.scheduler().num_preemptions() || engine.scheduler().block_manager().total_hit_blocks())
    std::fprintf(stderr, "prefix cache: %s hit; preemptions: %lld\n",
                 counted(engine.scheduler().block_manager().total_hit_blocks(), "block").c_str(),
                 (long long)engine.scheduler().num_preemptions());
  return 0;
}

int cmd_logits(const Flags& flags) {
  if (!flags.has("prompt-ids")) throw UsageError("--prompt-ids is required");
  if (flags.get_all("prompt-ids").size() > 1) throw UsageError("logits takes one --prompt-ids, got " +
                                                                std::to_string(flags.get_all("prompt-ids").size()));
  std::vector<int32_t> prompt = parse_ids(flags.get("prompt-ids"));
  EngineConfig config = engine_config_from(flags, /*default_allowed=*/false);
  // Only the prompt must fit max_model_len: the token sampled after it is not part of the output, but
  // the scheduler counts prompt + max_tokens (1), so make room for it.
  if (int64_t(prompt.size()) > config.max_model_len)
    fail("request 0: prompt (", counted(prompt.size(), "token"), ") exceeds max_model_len (", config.max_model_len, ")");
  // The room for that token is lost where the model runner cuts max_model_len to the model's positions: a
  // prompt of every position fits the model, but not with the token after it.
  const int positions = ModelConfig::load(config.model).max_position_embeddings;
  if (int64_t(prompt.size()) >= positions && config.max_model_len >= positions)
    fail("request 0: prompt (", counted(prompt.size(), "token"), ") must leave room for one token under the model's ",
         "max_position_embeddings (", positions, ")");
  config.max_model_len++;
  LLMEngine engine(config);
  note_a_cut_max_model_len(flags, engine.config().max_model_len);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 1;
  engine.add_request(prompt, greedy);
  log("%s", engine.describe().c_str());
  // Prefill the prompt (in chunks if the token budget is small): the last step's logits are those after
  // the last prompt token.
  std::vector<float> logits;
  while (!engine.is_finished()) engine.step(&logits);
  std::string out = "[";
  for (size_t i = 0; i < logits.size(); i++) {
    if (i) out += ',';
    json_append_float(out, logits[i]);
  }
  out += "]\n";
  write_stdout(out);
  return 0;
}

}  // namespace nanovllm
