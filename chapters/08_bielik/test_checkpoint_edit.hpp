/// @file test_checkpoint_edit.hpp
/// @brief Test helper: copies a golden tiny checkpoint into a scratch folder with edits
/// (a tensor dropped, reshaped, added, retyped), to prove the loader rejects it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace bielik {

struct EditableTensor {
  std::string dtype;           // "BF16", "F32", ...
  std::vector<int64_t> shape;  // row major
  std::vector<uint8_t> bytes;  // numel * item size
};
using TensorMap = std::map<std::string, EditableTensor>;

/// Writes a .safetensors file by hand (8-byte header size, JSON header, data).
void write_safetensors_file(const std::string& path, const TensorMap& tensors);

/// Copies `source_dir` (config.json + model.safetensors) to a fresh folder under /tmp
/// named after `case_name`, applying `edit` to the tensors and `edit_config` (if set) to
/// the text of config.json. The folder lives as long as the returned TempDir.
TempDir edited_copy(const std::string& source_dir, const std::string& case_name,
                    const std::function<void(TensorMap&)>& edit,
                    const std::function<void(std::string&)>& edit_config = nullptr);

}  // namespace bielik
