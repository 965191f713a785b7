// safetensors.cpp: the safetensors reader (parse_safetensors, SafetensorsFile, Checkpoint), the fp32
// conversion, and the writer.
#include "04_model_runner/checkpoint/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "01_sequence/base/bf16.h"
#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"
#include "01_sequence/base/json.h"

namespace nanovllm {

int64_t TensorView::numel() const {
  // Cannot overflow: a file's shapes were checked when it was opened (an empty tensor is tested for first,
  // since [2^40, 2^40, 0] is a valid empty shape whose partial products overflow).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string format_shape(const std::vector<int64_t>& shape) {
  // A hostile header may give a shape of millions of dimensions: the first 8, then how many there are.
  constexpr size_t kShown = 8;
  std::string out = "[";
  for (size_t i = 0; i < std::min(shape.size(), kShown); i++) out += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() > kShown) out += ", ... (" + std::to_string(shape.size()) + " dimensions)";
  return out + "]";
}

// ---------------------------------------------------------------------------------------------------
// Parsing a header

namespace {

// Reads a JSON integer in [0, 2^63). Strict like the Rust library's `usize` fields: 2.0 or "2" is not an
// integer here, although Json::as_int64 would accept 2.0.
bool read_non_negative(const Json& value, int64_t* out) {
  if (!value.is_integer() || value.as_int64() < 0) return false;
  *out = value.as_int64();
  return true;
}

// A JSON value for an error message, cut short: a hostile header could hold a megabyte-long array.
std::string brief(const Json& value) {
  std::string text = value.dump();
  return text.size() <= 48 ? text : text.substr(0, 45) + "...";
}

// Checks "__metadata__": the Rust library reads it as Option<HashMap<String, String>>, so null or an
// object of strings. We ignore its content.
void check_metadata(const Json& metadata, const std::string& source) {
  if (metadata.is_null()) return;
  if (!metadata.is_object())
    fail(source, ": __metadata__ must be an object of strings, got ", Json::type_name(metadata.type()));
  for (const Json::Member& m : metadata.as_object())
    if (!m.second.is_string())
      fail(source, ": __metadata__ entry '", m.first, "' must be a string, got ",
           Json::type_name(m.second.type()));
}

// One header entry, {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, checked against the
// data section of `data_size` bytes. Returns the view with `data` relative to the data section start.
TensorView parse_entry(const std::string& name, const Json& entry, uint64_t data_size,
                       const std::string& source, int64_t* begin_out) {
  const std::string where = source + ": tensor '" + name + "'";
  if (!entry.is_object())
    fail(where, ": expected an object {dtype, shape, data_offsets}, got ", Json::type_name(entry.type()));
  auto field = [&](const char* key, Json::Type type) -> const Json& {
    const Json* value = entry.find(key);
    if (!value) fail(where, ": missing field '", key, "'");
    if (value->type() != type)
      fail(where, ": field '", key, "': expected ", Json::type_name(type), ", got ",
           Json::type_name(value->type()));
    return *value;
  };

  TensorView view;
  view.name = name;
  view.file = source;
  const std::string& dtype_text = field("dtype", Json::Type::String).as_string();
  if (!dtype_from_name(dtype_text, &view.dtype))
    fail(where, ": unknown dtype '", dtype_text, "' (known: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");

  // numel and byte count, with overflow checks: every product stays below 2^63.
  const int64_t element_size = int64_t(dtype_size(view.dtype));
  int64_t numel = 1;
  bool too_large = false;
  for (const Json& d : field("shape", Json::Type::Array).as_array()) {
    int64_t dim;
    if (!read_non_negative(d, &dim))
      fail(where, ": field 'shape': entries must be non-negative integers, got ", brief(d));
    view.shape.push_back(dim);
    if (dim != 0 && numel > INT64_MAX / dim) {
      too_large = true;
    } else {
      numel *= dim;
    }
  }
  // A zero dimension makes the tensor empty however large the others are.
  if (std::find(view.shape.begin(), view.shape.end(), 0) != view.shape.end()) {
    too_large = false;
    numel = 0;
  }
  if (too_large || numel > INT64_MAX / element_size)
    fail(where, ": shape ", format_shape(view.shape), " is too large (more than 2^63 bytes)");
  const int64_t nbytes = numel * element_size;

  const std::vector<Json>& offsets = field("data_offsets", Json::Type::Array).as_array();
  int64_t begin = 0, end = 0;
  if (offsets.size() != 2 || !read_non_negative(offsets[0], &begin) || !read_non_negative(offsets[1], &end))
    fail(where, ": field 'data_offsets': expected [begin, end] as two non-negative integers, got ",
         brief(entry.at("data_offsets")));
  const std::string span = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (end < begin) fail(where, ": ", span, " end before they begin");
  if (end - begin != nbytes)
    fail(where, ": ", span, " hold ", end - begin, " bytes but ", dtype_text, " ", format_shape(view.shape),
         " needs ", nbytes);
  if (uint64_t(end) > data_size)
    fail(where, ": ", span, " lie outside the data section (", data_size, " bytes)");
  view.nbytes = size_t(nbytes);
  *begin_out = begin;
  return view;
}

}  // namespace

std::vector<TensorView> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& source) {
  if (size < 8) fail(source, ": file is ", size, " bytes, too short for a safetensors header");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; i--) header_size = (header_size << 8) | bytes[i];
  // Compare against the file before touching anything: a huge length is a corrupt file, not a request
  // to allocate.
  if (header_size > size - 8)
    fail(source, ": header length ", header_size, " exceeds the file (", size - 8,
         " bytes after the length field): truncated or not a safetensors file");
  // The header becomes a parsed JSON tree, up to ~65 times its size in memory (01_sequence/base/files.h). An
  // entry takes 100-200 bytes, so kConfigFile's 16 MiB is ~100,000 tensors in one file; Hugging Face's own
  // reader stops at 100 MB.
  if (header_size > uint64_t(kConfigFile.bytes))
    fail(source, ": header length ", header_size, " is more than the ", kConfigFile.bytes >> 20,
         " MiB this reader takes for a header");
  const std::string_view text(reinterpret_cast<const char*>(bytes + 8), size_t(header_size));
  const Json header = Json::parse(text, source + ": header");
  if (!header.is_object())
    fail(source, ": header must be a JSON object, got ", Json::type_name(header.type()));

  const uint8_t* data = bytes + 8 + header_size;
  const uint64_t data_size = size - 8 - header_size;
  std::vector<TensorView> tensors;
  std::vector<int64_t> begins;  // data_offsets[0] of each tensor
  std::set<std::string_view> names;
  for (const Json::Member& member : header.as_object()) {
    if (member.first == "__metadata__") {
      check_metadata(member.second, source);
      continue;
    }
    // JSON allows a repeated key; a checkpoint must not (which of the two would be the weight?).
    if (!names.insert(member.first).second)
      fail(source, ": tensor '", member.first, "' appears twice in the header");
    int64_t begin;
    tensors.push_back(parse_entry(member.first, member.second, data_size, source, &begin));
    tensors.back().data = data + begin;
    begins.push_back(begin);
  }

  // No two tensors may share a byte. Sort the non-empty spans by start; each must begin at or after the
  // furthest end seen so far. (Gaps are allowed: we are not pickier than reading safely requires.)
  std::vector<size_t> order;
  for (size_t i = 0; i < tensors.size(); i++)
    if (tensors[i].nbytes > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return begins[a] < begins[b]; });
  auto end_of = [&](size_t t) { return begins[t] + int64_t(tensors[t].nbytes); };
  auto span = [&](size_t t) { return "[" + std::to_string(begins[t]) + ", " + std::to_string(end_of(t)) + "]"; };
  for (size_t k = 1, furthest = order.empty() ? 0 : order[0]; k < order.size(); k++) {
    const size_t t = order[k];
    if (begins[t] < end_of(furthest))
      fail(source, ": tensors '", tensors[furthest].name, "' and '", tensors[t].name,
           "' overlap (data_offsets ", span(furthest), " and ", span(t), ")");
    furthest = t;  // no overlap, so t ends after every span before it
  }
  return tensors;
}

// ---------------------------------------------------------------------------------------------------
// SafetensorsFile: the mapping

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO named x.safetensors must not block us forever; it is refused just below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  SafetensorsFile file;
  file.path_ = path;
  if (st.st_size > 0) {  // mmap refuses a length of 0; parse_safetensors reports the empty file
    void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    int saved_errno = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail(path, ": cannot map: ", std::strerror(saved_errno));
    file.mapping_ = p;
    file.mapping_size_ = size_t(st.st_size);
  } else {
    ::close(fd);
  }
  // If this throws, `file`'s destructor unmaps. (A file truncated by another process while mapped would
  // raise SIGBUS on access; like every mmap-based loader, we assume checkpoints are not edited in place.)
  file.tensors_ = parse_safetensors(static_cast<const uint8_t*>(file.mapping_), file.mapping_size_, path);
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    tensors_ = std::move(other.tensors_);  // the views point into the mapping, which does not move
    mapping_ = other.mapping_;
    mapping_size_ = other.mapping_size_;
    other.mapping_ = nullptr;
    other.mapping_size_ = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (mapping_) munmap(mapping_, mapping_size_);
  mapping_ = nullptr;
  mapping_size_ = 0;
}

// ---------------------------------------------------------------------------------------------------
// Checkpoint: a model directory

void check_model_folder(const std::string& dir) {
  // "DIR/config.json: cannot read: Not a directory" would hide that DIR is a file (the config.json itself,
  // given as --model), and "No such file" that the whole folder is missing.
  struct stat st = {};
  if (stat(dir.c_str(), &st) != 0) fail(dir, ": no such model folder (", std::strerror(errno), ")");
  if (!S_ISDIR(st.st_mode)) fail(dir, ": not a folder; a model is the folder that holds config.json and *.safetensors");
}

Checkpoint Checkpoint::open(const std::string& dir) {
  check_model_folder(dir);
  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";

  if (optional_file_exists(index_path)) {
    // Sharded: the index's weight_map {tensor: shard} is the table of contents. Tensors a shard holds
    // beyond those listed for it are ignored, as transformers does.
    const Json index = Json::parse(read_file(index_path, kConfigFile), index_path);
    const Json* weight_map = index.find("weight_map");
    if (!weight_map) fail(index_path, ": missing field 'weight_map'");
    if (!weight_map->is_object())
      fail(index_path, ": field 'weight_map': expected an object, got ", Json::type_name(weight_map->type()));
    std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensor names
    std::set<std::string> listed;
    for (const Json::Member& m : weight_map->as_object()) {
      if (!m.second.is_string())
        fail(index_path, ": weight_map['", m.first, "']: expected a shard file name, got ",
             Json::type_name(m.second.type()));
      const std::string& shard = m.second.as_string();
      if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\0') != std::string::npos)
        fail(index_path, ": weight_map['", m.first, "']: '", shard, "' is not a file name in ", dir);
      if (!listed.insert(m.first).second) fail(index_path, ": tensor '", m.first, "' is listed twice");
      by_shard[shard].push_back(m.first);
    }
    for (const auto& [shard, names] : by_shard) {
      const std::string path = dir + "/" + shard;
      if (!is_regular_file(path)) {  // '.' or '..' name the folder itself; a FIFO, a link to nothing, a loop...
        struct stat st;
        const bool exists = stat(path.c_str(), &st) == 0;
        const int stat_errno = errno;
        const std::string why = exists ? (S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file")
                                : lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && stat_errno == ENOENT
                                    ? "is a symbolic link to nothing"
                                : stat_errno == ENOENT ? "does not exist"
                                                       : std::string("cannot be read (") + std::strerror(stat_errno) + ")";
        fail(index_path, ": shard '", shard, "' (of tensor '", names.front(), "') ", why, " in ", dir);
      }
      SafetensorsFile file = SafetensorsFile::open(path);
      std::map<std::string_view, const TensorView*> in_file;
      for (const TensorView& view : file.tensors()) in_file[view.name] = &view;
      for (const std::string& name : names) {
        auto it = in_file.find(name);
        if (it == in_file.end())
          fail(index_path, ": tensor '", name, "' is listed in shard '", shard, "', which does not hold it");
        checkpoint.tensors_[name] = *it->second;
      }
      checkpoint.files_.push_back(std::move(file));
    }
    return checkpoint;
  }

  // Not sharded: every *.safetensors file in the directory, in name order.
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* entry = readdir(d)) {
      std::string name = entry->d_name;
      const std::string suffix = ".safetensors";
      if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        files.push_back(name);
    }
    closedir(d);
  } else {
    fail(dir, ": cannot list: ", std::strerror(errno));
  }
  if (files.empty()) fail(dir, ": no model weights (no *.safetensors file, no model.safetensors.index.json)");
  std::sort(files.begin(), files.end());
  for (const std::string& name : files) {
    SafetensorsFile file = SafetensorsFile::open(dir + "/" + name);
    for (const TensorView& view : file.tensors()) {
      auto [it, inserted] = checkpoint.tensors_.emplace(view.name, view);
      if (!inserted)
        fail(dir, ": tensor '", view.name, "' appears in both ", it->second.file, " and ", view.file);
    }
    checkpoint.files_.push_back(std::move(file));
  }
  return checkpoint;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& Checkpoint::get(const std::string& name, const std::vector<int64_t>& expected_shape,
                                  const std::string& origin) const {
  const TensorView* view = find(name);
  if (!view) fail(dir_, ": the checkpoint has no tensor '", name, "'");
  if (view->shape != expected_shape)
    fail(view->file, ": tensor '", name, "' has shape ", format_shape(view->shape), ", expected ",
         format_shape(expected_shape), " (from ", origin, ")");
  return *view;
}

void Checkpoint::check_layout(const std::vector<TensorSpec>& layout, const std::string& origin) const {
  for (const TensorSpec& spec : layout) {
    const TensorView& view = get(spec.name, spec.shape, origin);
    if (view.dtype != DType::BF16 && view.dtype != DType::F16 && view.dtype != DType::F32)
      fail(view.file, ": tensor '", view.name, "' is ", dtype_name(view.dtype),
           "; model weights must be BF16, F16 or F32");
  }
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& entry : tensors_) out.push_back(entry.first);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// fp32 conversion. The data is little-endian, as on every machine we build for (x86-64, aarch64).

namespace {

// Converts n stored floats (Word: their 16 or 32 bits, read unaligned) with `to_float`. Returns false when
// one has an exponent of all ones (`exponent`): an infinity or a NaN.
template <class Word, class ToFloat>
bool convert_checking_finite(const uint8_t* p, size_t n, float* out, Word exponent, ToFloat to_float) {
  bool finite = true;
  for (size_t i = 0; i < n; i++) {
    Word word;
    std::memcpy(&word, p + sizeof(Word) * i, sizeof(Word));  // memcpy: the data need not be aligned
    out[i] = to_float(word);
    finite &= (word & exponent) != exponent;
  }
  return finite;
}

float f32_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

void read_as_float(const TensorView& view, float* out) {
  const size_t n = size_t(view.numel());
  const uint8_t* p = view.data;
  // An infinity or a NaN in one weight makes every logit NaN, and the first step would fail with no tensor
  // to blame: each tensor is checked here, on its stored bits, in the loop that converts it, so that the
  // check costs no second pass over the weights.
  bool finite = true;
  switch (view.dtype) {
    case DType::BF16: finite = convert_checking_finite(p, n, out, uint16_t(0x7f80), bf16_to_float); break;
    case DType::F16: finite = convert_checking_finite(p, n, out, uint16_t(0x7c00), fp16_to_float); break;
    case DType::F32: finite = convert_checking_finite(p, n, out, uint32_t(0x7f800000), f32_from_bits); break;
    default:
      fail(view.file, ": tensor '", view.name, "' is ", dtype_name(view.dtype),
           ", not one of the float types read (BF16, F16 or F32)");
  }
  if (finite) return;
  for (size_t i = 0; i < n; i++)
    if (!std::isfinite(out[i]))
      fail(view.file, ": tensor '", view.name, "' holds ", std::isnan(out[i]) ? "a NaN" : "an infinity", " (element ",
           i, " of ", n, ")");
}

// ---------------------------------------------------------------------------------------------------
// Writing


void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  // The header, with each tensor right after the previous one.
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [key, value] : metadata) m.set(key, value);
    header.set("__metadata__", std::move(m));
  }
  std::set<std::string> names;
  std::vector<size_t> sizes;
  uint64_t offset = 0;
  size_t largest_fill = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
      fail(path, ": cannot write tensor '", t.name, "': empty, reserved or duplicate name");
    if (!t.data && !t.fill) fail(path, ": cannot write tensor '", t.name, "': no data");
    uint64_t nbytes = dtype_size(t.dtype);
    Json shape = Json::array();
    for (int64_t d : t.shape) {
      if (d < 0 || (d > 0 && nbytes > uint64_t(INT64_MAX) / uint64_t(d)))
        fail(path, ": cannot write tensor '", t.name, "': bad shape ", format_shape(t.shape));
      nbytes *= uint64_t(d);
      shape.push_back(d);
    }
    Json entry = Json::object();
    entry.set("dtype", dtype_name(t.dtype));
    entry.set("shape", std::move(shape));
    Json offsets = Json::array();
    offsets.push_back(int64_t(offset));
    offsets.push_back(int64_t(offset + nbytes));
    entry.set("data_offsets", std::move(offsets));
    header.set(t.name, std::move(entry));
    offset += nbytes;
    sizes.push_back(size_t(nbytes));
    if (!t.data) largest_fill = std::max(largest_fill, size_t(nbytes));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad with spaces: the data section starts 8-aligned

  AtomicFileWriter out(path);
  uint8_t length[8];
  for (int i = 0; i < 8; i++) length[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.write(length, 8);
  out.write(text.data(), text.size());
  std::vector<uint8_t> buffer(largest_fill);  // reused by every `fill` tensor
  for (size_t i = 0; i < tensors.size(); i++) {
    if (tensors[i].data) {
      out.write(tensors[i].data, sizes[i]);
    } else {
      tensors[i].fill(buffer.data());
      out.write(buffer.data(), sizes[i]);
    }
  }
  out.commit();
}

}  // namespace nanovllm
