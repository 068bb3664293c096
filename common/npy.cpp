#include "npy.hpp"

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "bf16.hpp"

namespace bielik {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

size_t item_size(const std::string& path, const std::string& dtype) {
  if (dtype == "<f4" || dtype == "<i4" || dtype == "<u4") return 4;
  if (dtype == "<f8" || dtype == "<i8" || dtype == "<u8") return 8;
  if (dtype == "<u2" || dtype == "<i2" || dtype == "<f2") return 2;
  if (dtype == "|u1" || dtype == "|i1" || dtype == "|b1") return 1;
  fail(path, "unsupported .npy dtype '" + dtype + "' (little-endian numeric types only)");
}

// The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (7, 100), }
// We only need three keys, so a tiny scanner is enough.
std::string dict_value(const std::string& path, const std::string& header, const std::string& key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) fail(path, "malformed .npy header: no '" + key + "' key");
  at = header.find(':', at);
  if (at == std::string::npos) fail(path, "malformed .npy header near '" + key + "'");
  ++at;
  while (at < header.size() && header[at] == ' ') ++at;
  if (at >= header.size()) fail(path, "malformed .npy header near '" + key + "'");
  if (header[at] == '\'') {
    size_t end = header.find('\'', at + 1);
    if (end == std::string::npos) fail(path, "malformed .npy header: unterminated string");
    return header.substr(at + 1, end - at - 1);
  }
  if (header[at] == '(') {
    size_t end = header.find(')', at);
    if (end == std::string::npos) fail(path, "malformed .npy header: unterminated shape");
    return header.substr(at + 1, end - at - 1);
  }
  size_t end = header.find_first_of(",}", at);
  return header.substr(at, end - at);
}

std::vector<size_t> parse_shape(const std::string& path, const std::string& text) {
  std::vector<size_t> shape;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    size_t first = item.find_first_not_of(" L");
    if (first == std::string::npos) continue;  // trailing comma of a 1-tuple
    try {
      shape.push_back(static_cast<size_t>(std::stoull(item.substr(first))));
    } catch (const std::exception&) {
      fail(path, "malformed .npy shape '(" + text + ")'");
    }
  }
  return shape;
}

template <typename T>
T read_scalar(const uint8_t* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

}  // namespace

size_t NpyArray::numel() const {
  size_t count = 1;
  for (size_t dim : shape) count *= dim;
  return count;
}

std::string NpyArray::describe() const {
  std::string text = "shape (";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + ") " + dtype;
}

void NpyArray::require_shape(const std::vector<size_t>& expected) const {
  if (shape != expected) {
    NpyArray wanted;
    wanted.shape = expected;
    wanted.dtype = dtype;
    fail(path, "expected " + wanted.describe() + ", found " + describe());
  }
}

std::vector<float> NpyArray::to_float() const {
  std::vector<float> values(numel());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == "<f4") values[i] = read_scalar<float>(&bytes[i * 4]);
    else if (dtype == "<f8") values[i] = static_cast<float>(read_scalar<double>(&bytes[i * 8]));
    else if (dtype == "<u2") values[i] = bf16_bits_to_float(read_scalar<uint16_t>(&bytes[i * 2]));
    else fail(path, "cannot read dtype " + dtype + " as float");
  }
  return values;
}

std::vector<double> NpyArray::to_double() const {
  std::vector<double> values(numel());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == "<f8") values[i] = read_scalar<double>(&bytes[i * 8]);
    else if (dtype == "<f4") values[i] = read_scalar<float>(&bytes[i * 4]);
    else if (dtype == "<u2") values[i] = bf16_bits_to_float(read_scalar<uint16_t>(&bytes[i * 2]));
    else fail(path, "cannot read dtype " + dtype + " as double");
  }
  return values;
}

std::vector<uint16_t> NpyArray::bf16_bits() const {
  if (dtype != "<u2") fail(path, "expected bf16 bits stored as <u2, found " + dtype);
  std::vector<uint16_t> bits(numel());
  std::memcpy(bits.data(), bytes.data(), bits.size() * sizeof(uint16_t));
  return bits;
}

std::vector<int32_t> NpyArray::to_int32() const {
  std::vector<int32_t> values(numel());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == "<i4") {
      values[i] = read_scalar<int32_t>(&bytes[i * 4]);
    } else if (dtype == "<i8") {
      int64_t wide = read_scalar<int64_t>(&bytes[i * 8]);
      if (wide < INT32_MIN || wide > INT32_MAX) fail(path, "integer value does not fit in int32");
      values[i] = static_cast<int32_t>(wide);
    } else {
      fail(path, "cannot read dtype " + dtype + " as int32");
    }
  }
  return values;
}

NpyArray load_npy(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(path, "cannot open file (golden data missing? run `make golden`)");

  char magic[6];
  if (!file.read(magic, 6) || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, "not a .npy file (bad magic)");
  uint8_t version[2];
  if (!file.read(reinterpret_cast<char*>(version), 2)) fail(path, "truncated .npy header");
  uint32_t header_length = 0;
  if (version[0] == 1) {
    uint8_t length[2];
    if (!file.read(reinterpret_cast<char*>(length), 2)) fail(path, "truncated .npy header");
    header_length = length[0] | (length[1] << 8);
  } else if (version[0] == 2 || version[0] == 3) {
    uint8_t length[4];
    if (!file.read(reinterpret_cast<char*>(length), 4)) fail(path, "truncated .npy header");
    header_length = length[0] | (length[1] << 8) | (length[2] << 16) | (uint32_t(length[3]) << 24);
  } else {
    fail(path, "unsupported .npy format version " + std::to_string(version[0]));
  }
  std::string header(header_length, '\0');
  if (!file.read(header.data(), header_length)) fail(path, "truncated .npy header");

  NpyArray array;
  array.path = path;
  array.dtype = dict_value(path, header, "descr");
  if (dict_value(path, header, "fortran_order").find("True") != std::string::npos) {
    fail(path, "Fortran-order arrays are not supported (save with np.ascontiguousarray)");
  }
  if (!array.dtype.empty() && array.dtype[0] == '>') fail(path, "big-endian arrays are not supported");
  array.shape = parse_shape(path, dict_value(path, header, "shape"));
  size_t expected_bytes = array.numel() * item_size(path, array.dtype);
  array.bytes.resize(expected_bytes);
  if (expected_bytes > 0 && !file.read(reinterpret_cast<char*>(array.bytes.data()), expected_bytes)) {
    fail(path, "truncated data: expected " + std::to_string(expected_bytes) + " bytes for " + array.describe());
  }
  return array;
}

void save_npy(const std::string& path, const std::string& dtype, const std::vector<size_t>& shape,
              const void* data, size_t byte_count) {
  std::string shape_text = "(";
  for (size_t dim : shape) shape_text += std::to_string(dim) + ", ";
  shape_text += ")";
  std::string header = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // Pad so the data starts on a 64-byte boundary, ending the header with '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream file(path, std::ios::binary);
  if (!file) fail(path, "cannot create file");
  file.write("\x93NUMPY\x01\x00", 8);
  uint16_t length = static_cast<uint16_t>(header.size());
  file.put(static_cast<char>(length & 0xff));
  file.put(static_cast<char>(length >> 8));
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  file.write(static_cast<const char*>(data), static_cast<std::streamsize>(byte_count));
  if (!file) fail(path, "write failed");
}

}  // namespace bielik
