// safetensors.h: reading and writing checkpoints in Hugging Face's safetensors format, our own code.
//
// A .safetensors file is three parts, back to back:
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a JSON object: {"__metadata__": {"k": "v", ...},              (optional)
//                              "model.norm.weight": {"dtype": "BF16", "shape": [1024],
//                                                    "data_offsets": [BEGIN, END]}, ...}
//   [rest]     the data section: each tensor's bytes, row-major, little-endian, at
//              [BEGIN, END) counted from the start of the data section
//
// Reading maps the file into memory (mmap, read-only) and hands out views into the mapping, so opening
// an 8B-parameter checkpoint costs no copy and no allocation proportional to its size; the pages are read
// from disk when the model runner first touches them. Every byte of the header is untrusted: a malformed
// file gives one Error naming the file and (where relevant) the tensor, never a crash or a huge
// allocation.
//
//   SafetensorsFile    one mapped file and its tensors
//   Checkpoint         a model directory: one file, several shards with an index, or several files
//   read_as_float      a BF16 / F16 / F32 tensor converted to fp32
//   write_safetensors  the writer (tests, random models), readable by Hugging Face's library
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "04_model_runner/checkpoint/dtype.h"

namespace nanovllm {

// One tensor inside a mapped file. `data` points into the mapping and stays valid as long as the
// SafetensorsFile (or Checkpoint) that produced it is alive. It is not aligned: read it with memcpy.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // [] for a scalar
  const uint8_t* data = nullptr;
  size_t nbytes = 0;  // = numel() * dtype_size(dtype), checked when the file was opened
  std::string file;   // path of the file holding it, for error messages

  int64_t numel() const;
};

// A tensor a checkpoint must hold: its name and shape (see qwen3_checkpoint_layout in config.h).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// "[512, 64]", as error messages print shapes; past 8 dimensions, "[1, 1, 1, 1, 1, 1, 1, 1, ... (N dimensions)]".
std::string format_shape(const std::vector<int64_t>& shape);

// Parses and validates a whole safetensors file held in memory, `bytes[0, size)`. Returns the tensors in
// header order, their `data` pointing into `bytes`. `source` (usually the path) starts every error
// message. This is the pure part of SafetensorsFile::open, exposed so that tests can feed it thousands
// of mangled buffers without touching the disk.
std::vector<TensorView> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& source);

// One memory-mapped .safetensors file. Movable, not copyable; unmaps on destruction.
class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it (see parse_safetensors). Throws Error naming the path.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  void unmap();

  std::string path_;
  void* mapping_ = nullptr;  // the whole file, PROT_READ
  size_t mapping_size_ = 0;
  std::vector<TensorView> tensors_;
};

// Throws Error unless `dir` is a folder, naming a missing path or a file given in its place
// ("DIR: no such model folder (...)", "FILE: not a folder; ..."). ModelConfig::load and Checkpoint::open
// call it first, so whichever reads the model first says the same.
void check_model_folder(const std::string& dir);

// The weights of a model directory, as Hugging Face lays them out:
//   - `model.safetensors.index.json` present: its "weight_map" {tensor name: shard file name} is the
//     truth; every shard it names must exist and hold the tensors listed for it;
//   - otherwise every `*.safetensors` file in the directory (sorted by name); a tensor name found in two
//     files is an error, since we could not tell which one is meant.
// Movable, not copyable; the views returned stay valid while the Checkpoint lives.
class Checkpoint {
 public:
  // Throws Error naming the directory when it holds no checkpoint, or the file at fault.
  static Checkpoint open(const std::string& dir);

  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // The tensor called `name`, or nullptr.
  const TensorView* find(const std::string& name) const;
  // The tensor called `name`, which must exist and have exactly `expected_shape`; `origin` says where
  // the expected shape came from, for the message "...expected [c, d] (from config.json)".
  const TensorView& get(const std::string& name, const std::vector<int64_t>& expected_shape,
                        const std::string& origin = "config.json") const;
  // Checks that every tensor of `layout` is present with its shape and a float dtype (BF16, F16, F32).
  // Extra tensors are not looked at here (the tests use it on whole checkpoints); the loader
  // (load_qwen3_weights) refuses those config.json does not describe.
  void check_layout(const std::vector<TensorSpec>& layout, const std::string& origin = "config.json") const;

  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  const std::string& dir() const { return dir_; }

 private:
  Checkpoint() = default;

  std::string dir_;
  std::vector<SafetensorsFile> files_;          // owns the mappings the views point into
  std::map<std::string, TensorView> tensors_;   // by name
};

// Converts a BF16, F16 or F32 tensor to fp32: writes view.numel() floats to `out`. Any other dtype is
// an Error naming the file and tensor, and so is a NaN or an infinity in it (naming the element).
void read_as_float(const TensorView& view, float* out);

// One tensor for write_safetensors. Give its bytes either as `data` (numel * dtype_size bytes) or as
// `fill`, which is called once with a buffer of that many bytes to fill: this lets a caller produce a
// multi-gigabyte checkpoint one tensor at a time instead of holding it all in memory.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::function<void(uint8_t* out)> fill;
};

// Writes a safetensors file at `path` holding `tensors` in the given order, data contiguous, with an
// optional "__metadata__" of string pairs (Hugging Face writes {"format": "pt"}). The header is padded
// with spaces to a multiple of 8 bytes, as the reference Rust library does, so that the data section is
// 8-byte aligned. Writes to a temporary file in the same directory, then renames it over `path`, so a
// failure never leaves a half-written checkpoint. Throws Error naming the path (I/O failure) or the
// tensor (empty or duplicate name, no data).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata = {});

}  // namespace nanovllm
