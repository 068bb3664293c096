// Fuzz target: arbitrary bytes as a .safetensors file (chapter 08's safetensors.cpp).
//
// Contract (safetensors.hpp): SafetensorsFile::open either succeeds, and then every
// tensor's bytes lie inside the file and agree with its dtype and shape, or it throws
// std::runtime_error naming the file. The header's 8-byte length is attacker-chosen, so
// a run also shows that no length is trusted before it is checked (no huge allocation,
// no read past the mapping).
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "fuzz_check.hpp"
#include "safetensors.hpp"

using namespace bielik;

namespace {

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::write_scratch(data, size, ".safetensors");
  try {
    const SafetensorsFile file = SafetensorsFile::open(path);
    size_t tensor_bytes = 0;
    for (const std::string& name : file.names()) {
      const TensorView& t = file.tensor(name);
      FUZZ_CHECK(t.name == name, name);
      const size_t item = safetensors_dtype_size(t.dtype);
      FUZZ_CHECK(item > 0, name + ": dtype " + t.dtype + " accepted but has no size");
      for (int64_t extent : t.shape) FUZZ_CHECK(extent >= 0, name + ": negative extent accepted");
      FUZZ_CHECK(t.byte_size == t.numel() * item, name + ": byte size disagrees with shape " + format_shape(t.shape));
      if (t.byte_size > 0) {
        // The view must be the bytes the header names: data[8 + N + begin, + byte_size),
        // begin read here from the header independently of the reader.
        const uint64_t header_size = read_u64_le(data);
        const auto header = nlohmann::json::parse(data + 8, data + 8 + header_size);
        const uint64_t begin = header.at(name).at("data_offsets").at(0).get<uint64_t>();
        FUZZ_CHECK(8 + header_size + begin + t.byte_size <= size, name + ": bytes past the end of the file");
        FUZZ_CHECK(std::memcmp(t.data, data + 8 + header_size + begin, t.byte_size) == 0,
                   name + ": the view is not the bytes its data_offsets name");
      }
      tensor_bytes += t.byte_size;
    }
    FUZZ_CHECK(tensor_bytes <= size, "tensors overlap or exceed the file");
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(fuzz::names_file(e.what(), path), std::string("the error does not name the file: ") + e.what());
  }
  return 0;
}
