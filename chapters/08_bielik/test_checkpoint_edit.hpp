/// @file test_checkpoint_edit.hpp
/// @brief Test helper: copies a golden tiny checkpoint into a scratch folder with edits
/// (a tensor dropped, reshaped, added, retyped), to prove the loader rejects it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace bielik {

struct EditableTensor {
  std::string dtype;           // "BF16", "F32", ...
  std::vector<int64_t> shape;  // row major
  std::vector<uint8_t> bytes;  // numel * item size
};
using TensorMap = std::map<std::string, EditableTensor>;

/// Writes a .safetensors file by hand (8-byte header size, JSON header, data).
void write_safetensors_file(const std::string& path, const TensorMap& tensors);

/// A scratch folder under the system temp directory that is removed when this object
/// goes out of scope, so a test run leaves nothing behind (move-only: one owner).
class ScratchCheckpoint {
 public:
  explicit ScratchCheckpoint(std::string path) : path_(std::move(path)) {}
  ScratchCheckpoint(ScratchCheckpoint&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchCheckpoint& operator=(ScratchCheckpoint&& other) noexcept;
  ScratchCheckpoint(const ScratchCheckpoint&) = delete;
  ScratchCheckpoint& operator=(const ScratchCheckpoint&) = delete;
  ~ScratchCheckpoint();

  const std::string& path() const { return path_; }
  operator const std::string&() const { return path_; }  // pass it where a model folder is expected

 private:
  std::string path_;
};

/// Copies `source_dir` (config.json + model.safetensors) to a fresh folder under the
/// system temp directory named after `case_name`, applying `edit` to the tensors and
/// `edit_config` (if set) to the text of config.json. The folder lives as long as the
/// returned object.
ScratchCheckpoint edited_copy(const std::string& source_dir, const std::string& case_name,
                              const std::function<void(TensorMap&)>& edit,
                              const std::function<void(std::string&)>& edit_config = nullptr);

}  // namespace bielik
