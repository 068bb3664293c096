/// @file bf16.hpp
/// @brief Host-side bfloat16 helpers.
///
/// bf16 is the top 16 bits of an IEEE float32: same exponent range as fp32 (so Bielik's
/// large activations never overflow, unlike fp16), 8 bits of mantissa. On the host we
/// keep bf16 values as raw uint16_t bits; `__nv_bfloat16` has the same layout, so a
/// std::vector<uint16_t> copies straight into a device `__nv_bfloat16` buffer.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace bielik {

/// Widens bf16 bits to float exactly (bf16 -> fp32 is lossless).
inline float bf16_bits_to_float(uint16_t bits) {
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

/// Rounds float to the nearest bf16, ties to even (what numpy/ml_dtypes and
/// __float2bfloat16 do). NaN stays NaN.
inline uint16_t float_to_bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

/// Rounds a float through bf16 and back: the value a bf16 tensor would hold.
inline float round_to_bf16(float value) { return bf16_bits_to_float(float_to_bf16_bits(value)); }

inline std::vector<float> bf16_to_float(const std::vector<uint16_t>& bits) {
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_bits_to_float(bits[i]);
  return values;
}

inline std::vector<uint16_t> float_to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16_bits(values[i]);
  return bits;
}

}  // namespace bielik
