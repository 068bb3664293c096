/// @file fuzz_check.hpp
/// @brief What every fuzz target here shares: the libFuzzer entry point, a check that
/// aborts (so libFuzzer, or the corpus replay under ctest, reports the input), and a
/// scratch file the targets that read files write their input to.
///
/// The targets state contracts the loaders document (safetensors.hpp, tokenizer.hpp,
/// model_config.hpp): bad input is refused with a std::runtime_error (or, for text,
/// std::invalid_argument) whose message names the file; nothing else escapes, nothing
/// crashes, nothing reads outside its bytes. An exception of any other type is left
/// uncaught on purpose: libFuzzer reports it as a crash, and so does the replay.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define FUZZ_CHECK(condition, what)                                                            \
  do {                                                                                         \
    if (!(condition)) {                                                                        \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s (%s)\n", __FILE__, __LINE__, #condition, \
                   std::string(what).c_str());                                                 \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace bielik::fuzz {

/// Writes `size` bytes of `data` to `path`, replacing what was there.
inline void write_scratch_to(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), std::streamsize(size));
  out.close();
  FUZZ_CHECK(out.good(), "cannot write the scratch file " + path);
}

/// A per-process file under $TMPDIR (or /tmp) holding `size` bytes of `data`; the same
/// path every call, so a long run does not fill the disk, removed when the process ends.
inline const std::string& write_scratch(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/bielik_fuzz_" + std::to_string(getpid()) + suffix;
  }();
  // Registered after `path` is built, so it runs before `path` is destroyed.
  static const bool cleanup_registered = std::atexit([] { std::remove(path.c_str()); }) == 0;
  (void)cleanup_registered;
  write_scratch_to(path, data, size);
  return path;
}

/// Whether `message` names `path`: every loader error must say which file it is about.
inline bool names_file(const char* message, const std::string& path) {
  return std::string(message).find(path) != std::string::npos;
}

}  // namespace bielik::fuzz
