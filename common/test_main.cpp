// The test runner every test executable links. Compiled twice by CMake:
//   bielik_test_main_cpu  runs the tests;
//   bielik_test_main_gpu  (BIELIK_TEST_NEEDS_GPU) first looks for a CUDA device and,
//                         with none, exits 77, which ctest reports as "skipped"
//                         (SKIP_RETURN_CODE, set on GPU tests only), never as passed.
//                         A GPU it finds but cannot use (a broken driver), or no GPU
//                         where BIELIK_REQUIRE_GPU=1 (scripts/gpu_run.sh sets it), fails.
#ifndef BIELIK_CATCH2_V3
#define CATCH_CONFIG_RUNNER
#endif
#include "catch_compat.hpp"

#include <cstdio>
#include <exception>

#ifdef BIELIK_TEST_NEEDS_GPU
#include "device_buffer.cuh"
#include "test_support.hpp"
#endif

int main(int argc, char** argv) {
#ifdef BIELIK_TEST_NEEDS_GPU
  bool have_device = false;
  try {
    have_device = bielik::cuda_device_available();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: failing the GPU tests rather than skipping them\n", error.what());
    return 1;
  }
  if (!have_device) {
    if (bielik::env_flag("BIELIK_REQUIRE_GPU")) {
      std::fprintf(stderr, "BIELIK_REQUIRE_GPU is set but no CUDA device was found: failing the GPU tests\n");
      return 1;
    }
    std::printf("no CUDA device found: skipping GPU tests (exit code 77 = skipped)\n");
    return 77;
  }
#endif
  // Catch2 returns the number of failed assertions (at most 255), not a status: passed on
  // as it is, exactly 77 failures would read as "skipped" to ctest. Any failure is 1.
  const int failed = Catch::Session().run(argc, argv);
  return failed == 0 ? 0 : 1;
}
