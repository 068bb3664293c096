/// @file compare.hpp
/// @brief Comparing a result against a reference, the way every test in the book does.
///
/// The headline number is the relative norm error ||actual - expected|| / ||expected||,
/// which does not care about the scale of the tensor. fp32 paths land far under 1e-3,
/// paths with bf16 inputs or outputs between 1e-3 and 1e-2. NaN or Inf in the result
/// always fails, even when the reference has them too, because the model never should.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bielik {

/// Tolerances on the relative norm error, one set for the whole book.
namespace tolerance {
constexpr double kFp32 = 1e-5;        ///< fp32 math vs float64 reference
constexpr double kBf16Output = 1e-2;  ///< bf16 inputs/outputs, fp32 accumulation
}  // namespace tolerance

struct CompareResult {
  bool passed = false;
  double rel_norm_error = 0;   ///< ||a - e|| / ||e||
  double max_abs_error = 0;    ///< max |a - e|
  size_t worst_index = 0;      ///< where max_abs_error happens
  size_t nonfinite_count = 0;  ///< NaN/Inf elements in `actual`
  std::string report;          ///< human-readable summary + first mismatches
};

/// Compares `count` values. `label` names the case in the report.
CompareResult compare(const std::string& label, const float* actual, const double* expected, size_t count,
                      double rel_tolerance);

CompareResult compare(const std::string& label, const std::vector<float>& actual,
                      const std::vector<double>& expected, double rel_tolerance);
CompareResult compare(const std::string& label, const std::vector<float>& actual,
                      const std::vector<float>& expected, double rel_tolerance);
/// `actual` given as bf16 bits (what a GPU kernel wrote).
CompareResult compare_bf16(const std::string& label, const std::vector<uint16_t>& actual_bits,
                           const std::vector<double>& expected, double rel_tolerance);
CompareResult compare_bf16(const std::string& label, const std::vector<uint16_t>& actual_bits,
                           const std::vector<float>& expected, double rel_tolerance);

}  // namespace bielik
