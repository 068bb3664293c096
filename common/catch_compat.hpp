/// @file catch_compat.hpp
/// @brief Include this instead of Catch2 directly: works with Catch2 v2 (Debian) and v3.
///
/// CMake defines BIELIK_CATCH2_V3 when it finds Catch2 3.x. The macros used in this
/// book (TEST_CASE, SECTION, REQUIRE, CHECK, INFO, CAPTURE, FAIL, Approx) are the
/// same in both versions; only the header names differ.
#pragma once

#ifdef BIELIK_CATCH2_V3
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/catch_approx.hpp>
#include <catch2/generators/catch_generators.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif
