// safetensors: mmap the file, parse the JSON header, validate every entry against the
// file size before handing out pointers into the mapping.
#include "safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace bielik {

namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger "length" is a
// sign of a corrupt or non-safetensors file, and we would not want to parse it anyway.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

std::string system_error_text() { return std::strerror(errno); }

bool file_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ")";
  return out.str();
}

size_t TensorView::numel() const {
  size_t count = 1;
  for (int64_t dim : shape) count *= size_t(dim);
  return count;
}

// ---------------------------------------------------------------------------------------
// The mapping: a read-only, private view of the whole file. MAP_PRIVATE + PROT_READ means
// nothing we do can change the file; the fd can be closed right after mmap.
struct SafetensorsFile::Mapping {
  void* address = nullptr;
  size_t size = 0;
  Mapping(void* a, size_t s) : address(a), size(s) {}
  ~Mapping() {
    if (address) ::munmap(address, size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(address); }
};

SafetensorsFile::SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

namespace {

// One header entry, checked against the data section size; returns the view.
TensorView parse_entry(const std::string& path, const std::string& name, const json& entry,
                       const uint8_t* data_section, uint64_t data_size) {
  auto where = "tensor '" + name + "'";
  if (!entry.is_object()) fail(path, where + ": header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) fail(path, where + ": header entry has no '" + key + "'");

  TensorView view;
  view.name = name;
  if (!entry["dtype"].is_string()) fail(path, where + ": 'dtype' is not a string");
  view.dtype = entry["dtype"].get<std::string>();
  size_t item_size = safetensors_dtype_size(view.dtype);
  if (item_size == 0) fail(path, where + ": unknown dtype '" + view.dtype + "'");

  const json& shape = entry["shape"];
  if (!shape.is_array()) fail(path, where + ": 'shape' is not an array");
  // numel in 128 bits' worth of caution: a shape like [2^40, 2^40] must not wrap around
  // and then "match" a small byte range.
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& dim : shape) {
    if (!dim.is_number_integer()) fail(path, where + ": shape " + shape.dump() + " holds a non-integer");
    int64_t value = dim.get<int64_t>();
    if (value < 0) fail(path, where + ": shape " + shape.dump() + " has a negative dimension");
    view.shape.push_back(value);
    if (value != 0 && numel > std::numeric_limits<uint64_t>::max() / uint64_t(value)) overflow = true;
    numel *= uint64_t(value);
  }

  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    fail(path, where + ": 'data_offsets' must be two non-negative integers, got " + offsets.dump());
  uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end)
    fail(path, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] end before they begin");
  if (end > data_size)
    fail(path, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] reach past the data section (" + std::to_string(data_size) +
                   " bytes): the file is truncated or the header is wrong");
  uint64_t expected_bytes = numel * item_size;
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / item_size || end - begin != expected_bytes)
    fail(path, where + ": " + view.dtype + " " + format_shape(view.shape) + " needs " +
                   (overflow ? std::string("more than 2^64") : std::to_string(expected_bytes)) +
                   " bytes but data_offsets give " + std::to_string(end - begin));
  view.data = data_section + begin;
  view.byte_size = size_t(end - begin);
  return view;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open safetensors file: " + system_error_text());
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    std::string error = system_error_text();
    ::close(fd);
    fail(path, "cannot stat: " + error);
  }
  uint64_t file_size = uint64_t(info.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path, "file is " + std::to_string(file_size) +
                   " bytes, too short for the 8-byte header length: truncated or not a safetensors file");
  }
  void* address = ::mmap(nullptr, size_t(file_size), PROT_READ, MAP_PRIVATE, fd, 0);
  std::string mmap_error = address == MAP_FAILED ? system_error_text() : "";
  ::close(fd);  // the mapping keeps its own reference to the file
  if (address == MAP_FAILED) fail(path, "mmap failed: " + mmap_error);

  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::make_unique<Mapping>(address, size_t(file_size));
  const uint8_t* bytes = file.mapping_->bytes();

  // Header length: little-endian u64, assembled byte by byte (endian- and alignment-safe).
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_size) +
                   " bytes is implausible (limit 100 MB): not a safetensors file?");
  if (8 + header_size > file_size)
    fail(path, "header length " + std::to_string(header_size) + " bytes but the file has only " +
                   std::to_string(file_size - 8) + " bytes after the length: truncated file");

  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_size);
  } catch (const json::exception& error) {  // parse_error, or out_of_range for a number like 4e335
    fail(path, std::string("malformed header JSON: ") + error.what());
  }
  if (!header.is_object()) fail(path, "malformed header: the JSON is not an object");

  const uint8_t* data_section = bytes + 8 + header_size;
  uint64_t data_size = file_size - 8 - header_size;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      // Free-form string -> string map; keep the strings, ignore anything odd.
      if (it.value().is_object())
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          if (m.value().is_string()) file.metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    file.tensors_.emplace(it.key(), parse_entry(path, it.key(), it.value(), data_section, data_size));
  }

  // Overlap check: sorted by start, each tensor must begin at or after the previous end.
  // (Empty tensors occupy no bytes and cannot overlap anything.)
  std::vector<const TensorView*> by_start;
  for (const auto& [name, view] : file.tensors_)
    if (view.byte_size > 0) by_start.push_back(&view);
  std::sort(by_start.begin(), by_start.end(),
            [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_start.size(); ++i) {
    const TensorView& previous = *by_start[i - 1];
    if (by_start[i]->data < previous.data + previous.byte_size)
      fail(path, "tensors '" + previous.name + "' and '" + by_start[i]->name + "' overlap in the data section");
  }
  return file;
}

const TensorView& SafetensorsFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, "no tensor named '" + name + "'");
  return it->second;
}

bool SafetensorsFile::contains(const std::string& name) const { return tensors_.count(name) != 0; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  for (const auto& entry : tensors_) result.push_back(entry.first);
  return result;
}

// ---------------------------------------------------------------------------------------
// Checkpoint: one file or an index of shards.

Checkpoint Checkpoint::open_dir(const std::string& model_dir) {
  Checkpoint checkpoint;
  checkpoint.dir_ = model_dir;
  std::string single = model_dir + "/model.safetensors";
  std::string index_path = model_dir + "/model.safetensors.index.json";

  if (file_exists(index_path)) {
    std::ifstream in(index_path);
    if (!in) fail(index_path, "cannot open: " + system_error_text());
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& error) {  // parse_error, or out_of_range for a number like 4e335
      fail(index_path, std::string("malformed JSON: ") + error.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(index_path, "has no 'weight_map' object");
    std::map<std::string, size_t> shard_slot;  // shard file name -> index into files_
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail(index_path, "weight_map['" + it.key() + "'] is not a file name");
      std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == "..")
        fail(index_path, "weight_map['" + it.key() + "'] names '" + shard + "', which is outside the directory");
      auto slot = shard_slot.find(shard);
      if (slot == shard_slot.end()) {
        checkpoint.files_.push_back(SafetensorsFile::open(model_dir + "/" + shard));
        slot = shard_slot.emplace(shard, checkpoint.files_.size() - 1).first;
      }
      if (!checkpoint.files_[slot->second].contains(it.key()))
        fail(index_path, "lists tensor '" + it.key() + "' in " + shard + ", but that shard does not hold it");
      checkpoint.file_index_[it.key()] = slot->second;
    }
  } else if (file_exists(single)) {
    checkpoint.files_.push_back(SafetensorsFile::open(single));
    for (const std::string& name : checkpoint.files_[0].names()) checkpoint.file_index_[name] = 0;
  } else {
    fail(model_dir, "no checkpoint here: expected model.safetensors or model.safetensors.index.json "
                    "(with its model-0000K-of-0000N.safetensors shards)");
  }
  return checkpoint;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = file_index_.find(name);
  if (it == file_index_.end()) fail(dir_, "checkpoint has no tensor named '" + name + "'");
  return files_[it->second].path();
}

const TensorView& Checkpoint::tensor(const std::string& name) const {
  auto it = file_index_.find(name);
  if (it == file_index_.end()) fail(dir_, "checkpoint has no tensor named '" + name + "'");
  return files_[it->second].tensor(name);
}

bool Checkpoint::contains(const std::string& name) const { return file_index_.count(name) != 0; }

const TensorView& Checkpoint::tensor_checked(const std::string& name, const std::string& dtype,
                                             const std::vector<int64_t>& shape) const {
  const TensorView& view = tensor(name);
  const std::string& file = file_of(name);
  if (view.dtype != dtype)
    fail(file, "tensor '" + name + "' has dtype " + view.dtype + ", expected " + dtype);
  if (view.shape != shape)
    fail(file, "tensor '" + name + "' has shape " + format_shape(view.shape) + ", expected " + format_shape(shape));
  return view;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> result;
  for (const auto& entry : file_index_) result.push_back(entry.first);
  return result;
}

}  // namespace bielik
