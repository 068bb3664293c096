#include "test_checkpoint_edit.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "safetensors.hpp"

namespace bielik {

void write_safetensors_file(const std::string& path, const TensorMap& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    header[name] = {{"dtype", tensor.dtype},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  uint64_t size = text.size();
  unsigned char size_bytes[8];
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<unsigned char>(size >> (8 * i));  // little endian
  out.write(reinterpret_cast<const char*>(size_bytes), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& [name, tensor] : tensors) {
    out.write(reinterpret_cast<const char*>(tensor.bytes.data()), std::streamsize(tensor.bytes.size()));
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

TempDir edited_copy(const std::string& source_dir, const std::string& case_name,
                    const std::function<void(TensorMap&)>& edit,
                    const std::function<void(std::string&)>& edit_config) {
  namespace fs = std::filesystem;
  TempDir scratch("ch08_" + case_name);  // removed again if the copy below throws
  const fs::path dir = scratch.path;

  std::ifstream config_in(source_dir + "/config.json");
  std::stringstream config_text;
  config_text << config_in.rdbuf();
  std::string config = config_text.str();
  if (edit_config) edit_config(config);
  std::ofstream(dir / "config.json") << config;

  TensorMap tensors;
  {
    SafetensorsFile file = SafetensorsFile::open(source_dir + "/model.safetensors");
    for (const std::string& name : file.names()) {
      const TensorView& view = file.tensor(name);
      tensors[name] = {view.dtype, view.shape, std::vector<uint8_t>(view.data, view.data + view.byte_size)};
    }
  }
  if (edit) edit(tensors);
  write_safetensors_file((dir / "model.safetensors").string(), tensors);
  return scratch;
}

}  // namespace bielik
