/// @file npy.hpp
/// @brief A small reader for numpy's .npy files (format versions 1-3).
///
/// The golden generators write every tensor as .npy. bf16 tensors are stored as their
/// raw bits with dtype '<u2' (numpy has no bf16 and ml_dtypes' dtype does not survive
/// np.save), so `bf16_bits()` reads '<u2' and `to_float()` widens it as bf16.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bielik {

/// One .npy array: its dtype descriptor ('<f4', '<u2', ...), shape and raw bytes.
struct NpyArray {
  std::string path;              ///< where it was read from, for error messages
  std::string dtype;             ///< numpy descr, little endian only: <f4 <f8 <u2 <i4 <i8 |u1
  std::vector<size_t> shape;     ///< C order (row major)
  std::vector<uint8_t> bytes;    ///< numel * item size

  size_t numel() const;
  /// Throws naming the file unless the shape equals `expected`.
  void require_shape(const std::vector<size_t>& expected) const;
  /// Values widened to float: <f4, <f8 and <u2 (read as bf16 bits).
  std::vector<float> to_float() const;
  /// Values as double (<f4, <f8): for float64 references.
  std::vector<double> to_double() const;
  /// Raw bf16 bits (dtype must be <u2).
  std::vector<uint16_t> bf16_bits() const;
  /// Integers (<i4 or <i8) as int32; throws if a value does not fit.
  std::vector<int32_t> to_int32() const;
  /// "shape (7, 100) <u2" for messages.
  std::string describe() const;
};

/// Reads a .npy file. A missing file throws with a hint to run `make golden`;
/// a malformed header, a big-endian or Fortran-order array, or a truncated data
/// section throws naming the file and the problem.
NpyArray load_npy(const std::string& path);

/// Writes a C-order .npy file (used by tests that make their own inputs).
void save_npy(const std::string& path, const std::string& dtype, const std::vector<size_t>& shape,
              const void* data, size_t byte_count);

}  // namespace bielik
