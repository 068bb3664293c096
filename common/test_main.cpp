// The test runner every test executable links. Compiled twice by CMake:
//   bielik_test_main_cpu  runs the tests;
//   bielik_test_main_gpu  (BIELIK_TEST_NEEDS_GPU) first looks for a CUDA device and,
//                         with none, exits 77, which ctest reports as "skipped"
//                         (SKIP_RETURN_CODE), never as passed.
#ifndef BIELIK_CATCH2_V3
#define CATCH_CONFIG_RUNNER
#endif
#include "catch_compat.hpp"

#include <cstdio>

#ifdef BIELIK_TEST_NEEDS_GPU
#include "device_buffer.cuh"
#endif

int main(int argc, char** argv) {
#ifdef BIELIK_TEST_NEEDS_GPU
  if (!bielik::cuda_device_available()) {
    std::printf("no CUDA device found: skipping GPU tests (exit code 77 = skipped)\n");
    return 77;
  }
#endif
  return Catch::Session().run(argc, argv);
}
