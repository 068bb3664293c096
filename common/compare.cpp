#include "compare.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "bf16.hpp"

namespace bielik {

CompareResult compare(const std::string& label, const float* actual, const double* expected, size_t count,
                      double rel_tolerance) {
  CompareResult result;
  double diff_squares = 0, ref_squares = 0;
  for (size_t i = 0; i < count; ++i) {
    double a = actual[i], e = expected[i];
    if (!std::isfinite(a)) {
      ++result.nonfinite_count;
      continue;
    }
    double diff = std::fabs(a - e);
    diff_squares += diff * diff;
    ref_squares += e * e;
    if (diff > result.max_abs_error) {
      result.max_abs_error = diff;
      result.worst_index = i;
    }
  }
  // An all-zero reference makes the relative error meaningless: fall back to absolute.
  result.rel_norm_error = ref_squares > 0 ? std::sqrt(diff_squares / ref_squares) : std::sqrt(diff_squares);
  result.passed = count > 0 && result.nonfinite_count == 0 && result.rel_norm_error <= rel_tolerance;

  std::ostringstream text;
  text << label << ": " << (result.passed ? "PASS" : "FAIL") << "  n=" << count
       << "  rel_norm_err=" << result.rel_norm_error << " (tol " << rel_tolerance << ")"
       << "  max_abs_err=" << result.max_abs_error << " at [" << result.worst_index << "]";
  if (count == 0) text << "  (empty comparison)";
  if (result.nonfinite_count) text << "  NaN/Inf elements: " << result.nonfinite_count;
  if (!result.passed && count > 0) {
    // The first few elements that stand out: non-finite, or off by more than the
    // tolerance times the reference's RMS (a per-element scale that zeros don't break).
    double ref_rms = std::sqrt(ref_squares / static_cast<double>(count));
    int shown = 0;
    text << "\n  first mismatches (index: actual vs expected):";
    for (size_t i = 0; i < count && shown < 8; ++i) {
      double a = actual[i], e = expected[i];
      if (!std::isfinite(a) || std::fabs(a - e) > rel_tolerance * std::fmax(std::fabs(e), ref_rms) * 4) {
        text << "\n    [" << i << "]: " << a << " vs " << e;
        ++shown;
      }
    }
  }
  result.report = text.str();
  return result;
}

CompareResult compare(const std::string& label, const std::vector<float>& actual,
                      const std::vector<double>& expected, double rel_tolerance) {
  if (actual.size() != expected.size()) {
    throw std::runtime_error(label + ": size mismatch " + std::to_string(actual.size()) + " vs " +
                             std::to_string(expected.size()));
  }
  return compare(label, actual.data(), expected.data(), actual.size(), rel_tolerance);
}

CompareResult compare(const std::string& label, const std::vector<float>& actual,
                      const std::vector<float>& expected, double rel_tolerance) {
  return compare(label, actual, std::vector<double>(expected.begin(), expected.end()), rel_tolerance);
}

CompareResult compare_bf16(const std::string& label, const std::vector<uint16_t>& actual_bits,
                           const std::vector<double>& expected, double rel_tolerance) {
  return compare(label, bf16_to_float(actual_bits), expected, rel_tolerance);
}

CompareResult compare_bf16(const std::string& label, const std::vector<uint16_t>& actual_bits,
                           const std::vector<float>& expected, double rel_tolerance) {
  return compare(label, bf16_to_float(actual_bits), expected, rel_tolerance);
}

}  // namespace bielik
