// random_model.cpp: presets, the deterministic Gaussian generator, and the checkpoint writer.
#include "04_model_runner/checkpoint/random_model.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <system_error>
#include <thread>

#include "01_sequence/base/bf16.h"
#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"

namespace nanovllm {

// ---------------------------------------------------------------------------------------------------
// Presets: the shapes of the real models (their config.json files), and a tiny one that keeps the real
// vocabulary so that real text can be tokenized and fed to it.

namespace {

struct Preset {
  const char* name;
  int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_position;
  bool tied;
};

constexpr Preset kPresets[] = {
    // name          vocab   hidden inter  layers heads kv  head_dim max_pos tied
    {"tiny",         151936, 64,    192,   2,     4,    2,  32,      4096,   true},
    {"qwen3-0.6b",   151936, 1024,  3072,  28,    16,   8,  128,     40960,  true},
    {"qwen3-1.7b",   151936, 2048,  6144,  28,    16,   8,  128,     40960,  true},
    {"qwen3-4b",     151936, 2560,  9728,  36,    32,   8,  128,     40960,  true},
    {"qwen3-8b",     151936, 4096,  12288, 36,    32,   8,  128,     40960,  false},
};

}  // namespace

std::vector<std::string> random_model_presets() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

ModelConfig random_model_config(const std::string& preset) {
  for (const Preset& p : kPresets) {
    if (preset != p.name) continue;
    ModelConfig c;
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.intermediate;
    c.num_hidden_layers = p.layers;
    c.num_attention_heads = p.heads;
    c.num_key_value_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.max_position_embeddings = p.max_position;
    c.tie_word_embeddings = p.tied;
    c.rms_norm_eps = 1e-6;  // all Qwen3 sizes share these
    c.rope_theta = 1e6;
    c.dtype = "bfloat16";
    c.eos_token_ids = {151645, 151643};  // <|im_end|>, <|endoftext|>
    c.bos_token_id = 151643;
    return c;
  }
  std::string known;
  for (const std::string& name : random_model_presets()) known += (known.empty() ? "" : ", ") + name;
  fail("unknown preset '", preset, "' (known: ", known, ")");
}

// ---------------------------------------------------------------------------------------------------
// The generator

namespace {

// splitmix64 (Steele, Lea, Flood): a strong 64-bit mixer. Steps `state` and returns a well-mixed value;
// used to derive one seed per (model seed, tensor, chunk) and to fill xoshiro's state.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman, Vigna): a fast generator with 256 bits of state, for the bulk of the numbers.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& word : s_) word = splitmix64(seed);  // never all zero
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1), from the top 53 bits: an exactly representable double.
  double unit() { return double(next() >> 11) * 0x1p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// The seed of one chunk of one tensor: chunks are independent streams, so any number of threads
// produce the same bytes.
uint64_t stream_seed(uint64_t seed, uint64_t tensor, uint64_t chunk) {
  uint64_t state = seed;
  state = splitmix64(state) ^ tensor;
  state = splitmix64(state) ^ chunk;
  return splitmix64(state);
}

constexpr int64_t kChunk = 1 << 16;  // elements per independent stream (even: normals come in pairs)

// Fills out[0, n) with bf16 values mean + stddev * z, z ~ N(0, 1), by Marsaglia's polar method: draw
// (u, v) uniform in the square (-1, 1)^2 until it falls inside the unit circle (s = u^2 + v^2 in (0, 1),
// 78.5% of draws); then u * f and v * f with f = sqrt(-2 ln(s) / s) are two independent standard
// normals. It is Box-Muller without the sine and cosine, and 1.7 times as fast.
// It runs in double: +, *, / and sqrt are exactly rounded everywhere, and a last-bit difference between
// two libm's log would change the bf16 result only for a value within 2^-50 of a rounding boundary
// (about one weight in 10^13), so the bytes are the same on every machine we know of.
void fill_normal_chunk(uint8_t* out, int64_t n, double mean, double stddev, uint64_t seed) {
  auto store = [out](int64_t i, double value) {  // as little-endian bf16, 2 bytes at out + 2 i
    const uint16_t bits = float_to_bf16(float(value));
    std::memcpy(out + 2 * i, &bits, 2);
  };
  Xoshiro256 rng(seed);
  for (int64_t i = 0; i < n; i += 2) {
    double u, v, s;
    do {
      u = 2.0 * rng.unit() - 1.0;  // exact: unit() is a multiple of 2^-53
      v = 2.0 * rng.unit() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = stddev * std::sqrt(-2.0 * std::log(s) / s);
    store(i, mean + u * f);
    if (i + 1 < n) store(i + 1, mean + v * f);
  }
}

// Fills a whole tensor of n bf16 values (2 n bytes at `out`), chunk by chunk, on all cores.
void fill_normal(uint8_t* out, int64_t n, double mean, double stddev, uint64_t seed, uint64_t tensor_index) {
  const int64_t chunks = ceil_div(n, kChunk);
  std::atomic<int64_t> next_chunk{0};
  auto work = [&] {
    for (int64_t c; (c = next_chunk++) < chunks;) {
      const int64_t begin = c * kChunk, count = std::min(kChunk, n - begin);
      fill_normal_chunk(out + 2 * begin, count, mean, stddev, stream_seed(seed, tensor_index, uint64_t(c)));
    }
  };
  const int64_t threads = std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  try {
    for (int64_t t = 1; t < threads; t++) pool.emplace_back(work);
  } catch (const std::system_error&) {  // no more threads to be had: the ones we have do all the chunks
  }
  work();
  for (std::thread& t : pool) t.join();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Creates `dir` if missing, and refuses one that already holds weights we would not overwrite (stale
// shards beside our model.safetensors would be read as part of the model).
void prepare_output_dir(const std::string& dir) {
  if (!is_directory(dir) && mkdir(dir.c_str(), 0755) != 0)
    fail(dir, ": cannot create the directory: ", std::strerror(errno));
  DIR* d = opendir(dir.c_str());
  if (!d) fail(dir, ": cannot list: ", std::strerror(errno));
  std::string stale;
  while (dirent* entry = readdir(d)) {
    std::string name = entry->d_name;
    if ((ends_with(name, ".safetensors") && name != "model.safetensors") ||
        name == "model.safetensors.index.json")
      stale = name;
  }
  closedir(d);
  if (!stale.empty()) fail(dir, ": already holds another checkpoint (", stale, "); choose an empty folder");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The checkpoint

void write_random_model(const ModelConfig& config, const std::string& out_dir, uint64_t seed,
                        const std::string& tokenizer_dir) {
  // Check the tokenizer first, so that a typo fails at once rather than after minutes of writing.
  const std::vector<std::string> tokenizer_files = {"tokenizer.json", "tokenizer_config.json"};
  if (!tokenizer_dir.empty())
    for (const std::string& name : tokenizer_files)
      if (!optional_file_exists(tokenizer_dir + "/" + name))
        fail(tokenizer_dir + "/" + name, ": no such file (a tokenizer folder needs ", name, ")");
  prepare_output_dir(out_dir);

  // Each tensor is generated when the writer reaches it, so memory holds one tensor at a time.
  const std::vector<TensorSpec> layout = qwen3_checkpoint_layout(config);
  std::vector<TensorToWrite> tensors;
  for (size_t index = 0; index < layout.size(); index++) {
    const TensorSpec& spec = layout[index];
    double mean = 0, stddev = 0;
    if (ends_with(spec.name, "norm.weight")) {  // input/post_attention/q/k norms and model.norm
      mean = 1.0;
      stddev = 0.1;
    } else if (spec.name == "model.embed_tokens.weight" || spec.name == "lm_head.weight") {
      stddev = 0.5;
    } else {  // a linear layer [out, in]: variance 1 / fan_in keeps activations at unit scale
      stddev = 1.0 / std::sqrt(double(spec.shape.at(1)));
    }
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    TensorToWrite t;
    t.name = spec.name;
    t.dtype = DType::BF16;
    t.shape = spec.shape;
    t.fill = [=](uint8_t* out) { fill_normal(out, numel, mean, stddev, seed, index); };
    tensors.push_back(std::move(t));
  }
  write_safetensors(out_dir + "/model.safetensors", tensors, {{"format", "pt"}});
  write_config(config, out_dir);
  for (const std::string& name : tokenizer_files)
    if (!tokenizer_dir.empty()) write_file(out_dir + "/" + name, read_file(tokenizer_dir + "/" + name));
}

void write_random_model(const std::string& preset, const std::string& out_dir, uint64_t seed,
                        const std::string& tokenizer_dir) {
  write_random_model(random_model_config(preset), out_dir, seed, tokenizer_dir);
}

// ---------------------------------------------------------------------------------------------------
// Writing once, atomically

namespace {

// What write_random_model writes: the checkpoint, then (when asked) the tokenizer.
constexpr const char* kModelFiles[] = {"model.safetensors", "config.json", "generation_config.json",
                                       "tokenizer.json", "tokenizer_config.json"};
constexpr int kFilesWithoutTokenizer = 3;

// The folder being written, for the signal handler: fixed buffers, since a handler may only call
// async-signal-safe functions (unlink, rmdir, signal, raise).
char g_temp_dir[4096];
char g_temp_suffix[32];  // ".tmp.<pid>": write_file / write_safetensors write FILE.tmp.<pid> first
volatile sig_atomic_t g_writing = 0;

void append(char* out, size_t size, const char* text) {
  size_t n = 0;
  while (n < size - 1 && out[n]) n++;
  while (n < size - 1 && *text) out[n++] = *text++;
  out[n] = '\0';
}

// Removes every file the writer may have created in `dir`, then `dir` itself (best effort).
void remove_temp_dir(const char* dir) {
  for (const char* name : kModelFiles)
    for (const char* suffix : {"", static_cast<const char*>(g_temp_suffix)}) {
      char path[sizeof g_temp_dir + 64] = "";
      append(path, sizeof path, dir);
      append(path, sizeof path, "/");
      append(path, sizeof path, name);
      append(path, sizeof path, suffix);
      unlink(path);
    }
  rmdir(dir);
}

void on_interrupt(int sig) {
  if (g_writing) remove_temp_dir(g_temp_dir);
  std::signal(sig, SIG_DFL);
  std::raise(sig);  // die of the signal, as without the handler
}

}  // namespace

bool is_complete_random_model(const std::string& dir, bool with_tokenizer) {
  const int files = with_tokenizer ? int(std::size(kModelFiles)) : kFilesWithoutTokenizer;
  for (int i = 0; i < files; i++)
    if (!is_regular_file(dir + "/" + kModelFiles[i])) return false;
  return true;
}

bool ensure_random_model(const std::string& preset, const std::string& dir, uint64_t seed,
                         const std::string& tokenizer_dir) {
  const bool with_tokenizer = !tokenizer_dir.empty();
  if (is_complete_random_model(dir, with_tokenizer)) return false;
  // Only an older, non-atomic writer could have left it incomplete; we do not guess what else is in it.
  if (is_directory(dir)) fail(dir, ": exists but is incomplete (an interrupted earlier run?); delete it");

  // The folder above `dir` (build/data) exists once `make` has unpacked the tokenizer; not after a build of
  // the binary alone.
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_directories(dir.substr(0, slash));
  const std::string temp = dir + ".tmp." + std::to_string(getpid());
  if (temp.size() >= sizeof g_temp_dir) fail(dir, ": path too long");
  g_temp_dir[0] = g_temp_suffix[0] = '\0';
  append(g_temp_dir, sizeof g_temp_dir, temp.c_str());
  append(g_temp_suffix, sizeof g_temp_suffix, (".tmp." + std::to_string(getpid())).c_str());
  struct sigaction action = {}, old_int, old_term;
  action.sa_handler = on_interrupt;
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  g_writing = 1;
  auto restore = [&] {
    g_writing = 0;
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  };
  try {
    write_random_model(preset, temp, seed, tokenizer_dir);
  } catch (...) {
    remove_temp_dir(temp.c_str());
    restore();
    throw;
  }
  const bool renamed = std::rename(temp.c_str(), dir.c_str()) == 0;
  const int rename_errno = errno;
  if (!renamed) remove_temp_dir(temp.c_str());
  restore();
  if (renamed) return true;
  // Another process renamed its copy first: that is as good as ours.
  if (is_complete_random_model(dir, with_tokenizer)) return false;
  fail(dir, ": cannot rename ", temp, " into place: ", std::strerror(rename_errno));
}

}  // namespace nanovllm
