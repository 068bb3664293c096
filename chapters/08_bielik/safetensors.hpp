/// @file safetensors.hpp
/// @brief Read-only, memory-mapped access to HuggingFace .safetensors checkpoints.
///
/// The format is small enough to read by hand:
///
///     [8 bytes: N, little-endian u64] [N bytes: JSON header] [data section]
///
/// The header maps every tensor name to {"dtype": "BF16", "shape": [V, C],
/// "data_offsets": [begin, end]}, offsets relative to the start of the data section,
/// plus an optional "__metadata__" object of strings that we skip. Tensors are stored
/// row-major (C order), little endian.
///
/// We mmap the file instead of reading it: a 3.2 GB checkpoint then costs no copy and
/// no heap; the kernel pages bytes in as the loader uploads each tensor to the GPU.
/// Every offset in the header is checked against the file size before any pointer is
/// handed out, so a truncated or hostile file fails with a message, never a segfault.
///
/// Note: the data section starts at 8 + N, and N is arbitrary, so `TensorView::data`
/// is not necessarily aligned for its dtype. Copy it (memcpy / cudaMemcpy), do not
/// reinterpret_cast it to `const uint16_t*`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace bielik {

/// One tensor inside a mapped file. `data` points into the mapping and stays valid as
/// long as the SafetensorsFile (or Checkpoint) that owns it lives, moves included.
struct TensorView {
  std::string name;             ///< e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string dtype;            ///< "BF16", "F16", "F32", "I32", ... (the file's spelling)
  std::vector<int64_t> shape;   ///< row major; {} for a scalar
  const uint8_t* data = nullptr;///< (byte_size) bytes, possibly unaligned
  size_t byte_size = 0;         ///< numel() * item size of dtype

  /// Product of the shape (1 for a scalar).
  size_t numel() const;
};

/// Bytes per element of a safetensors dtype name, or 0 if the name is unknown.
size_t safetensors_dtype_size(const std::string& dtype);

/// "(1536, 1536)": a shape the way error messages print it.
std::string format_shape(const std::vector<int64_t>& shape);

/// One memory-mapped .safetensors file. Movable, not copyable (it owns the mapping).
class SafetensorsFile {
 public:
  /// Maps and validates the file. Throws std::runtime_error naming the file and the
  /// problem: missing or unreadable file, file shorter than its header, malformed
  /// header JSON, unknown dtype, negative shape, offsets outside the data section or
  /// reversed, byte size that disagrees with the shape, overlapping tensors.
  static SafetensorsFile open(const std::string& path);

  /// The tensor called `name`; throws naming the file and the tensor if absent.
  const TensorView& tensor(const std::string& name) const;
  bool contains(const std::string& name) const;
  /// All tensor names, sorted.
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }
  /// The "__metadata__" strings of the header (often {"format": "pt"}); may be empty.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Defined in the .cpp, where Mapping is a complete type (unique_ptr needs that).
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

 private:
  struct Mapping;  // the mmap'ed region; unmaps in its destructor
  SafetensorsFile();

  std::string path_;
  std::unique_ptr<Mapping> mapping_;
  std::map<std::string, TensorView> tensors_;     // node-based: references survive moves
  std::map<std::string, std::string> metadata_;
};

/// A model directory in HuggingFace layout: either one `model.safetensors`, or shards
/// `model-0000K-of-0000N.safetensors` listed by `model.safetensors.index.json`
/// ({"weight_map": {tensor name: shard file name}}).
class Checkpoint {
 public:
  /// Opens every file of the checkpoint in `model_dir`. Throws naming the directory
  /// when neither model.safetensors nor model.safetensors.index.json exists, and
  /// naming the index when it is malformed or lists a tensor its shard lacks.
  static Checkpoint open_dir(const std::string& model_dir);

  /// The tensor `name` from whichever shard holds it; the error names the tensor
  /// and the directory.
  const TensorView& tensor(const std::string& name) const;
  bool contains(const std::string& name) const;
  /// The tensor after checking its dtype and shape. Errors read like
  /// "<file>: tensor 'model.layers.3.self_attn.q_proj.weight' has shape (1536, 100), expected (1536, 1536)".
  const TensorView& tensor_checked(const std::string& name, const std::string& dtype,
                                   const std::vector<int64_t>& shape) const;
  /// The file that holds `name` (throws like tensor() if absent).
  const std::string& file_of(const std::string& name) const;
  /// Every tensor name in the checkpoint, sorted.
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> file_index_;  // tensor name -> index into files_
};

}  // namespace bielik
