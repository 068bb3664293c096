// Fuzz target: arbitrary bytes as a sharded checkpoint's model.safetensors.index.json
// (chapter 08's Checkpoint::open_dir), in a scratch directory holding two real shards:
// a.safetensors with tensors "x" and "y", b.safetensors with "z".
//
// Contract (safetensors.hpp): open_dir either succeeds, and then every tensor it lists
// is in the shard the index names and inside the directory, or it throws
// std::runtime_error naming the index, the shard or the directory. A shard name that
// leaves the directory ("../x", "/etc/passwd") is refused, never opened.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "fuzz_check.hpp"
#include "safetensors.hpp"

using namespace bielik;

namespace {

// A little safetensors file with U8 tensors of the given names, 4 bytes each.
void write_shard(const std::string& path, const std::vector<std::string>& names) {
  std::string header = "{";
  for (size_t i = 0; i < names.size(); ++i)
    header += (i ? "," : "") + ("\"" + names[i] + "\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[") +
              std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  header += "}";
  std::string bytes(8, '\0');
  for (int b = 0; b < 8; ++b) bytes[size_t(b)] = char((uint64_t(header.size()) >> (8 * b)) & 0xff);
  bytes += header + std::string(4 * names.size(), 'w');
  fuzz::write_scratch_to(path, bytes.data(), bytes.size());
}

void remove_scratch_dir();

const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/bielik_fuzz_index_" + std::to_string(getpid());
    mkdir(path.c_str(), 0700);
    write_shard(path + "/a.safetensors", {"x", "y"});
    write_shard(path + "/b.safetensors", {"z"});
    return path;
  }();
  // Registered after `dir` is built, so it runs before `dir` is destroyed.
  static const bool cleanup_registered = std::atexit(remove_scratch_dir) == 0;
  (void)cleanup_registered;
  return dir;
}

void remove_scratch_dir() {
  const std::string& dir = scratch_dir();
  for (const char* file : {"a.safetensors", "b.safetensors", "model.safetensors.index.json"})
    std::remove((dir + "/" + file).c_str());
  rmdir(dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = scratch_dir();
  fuzz::write_scratch_to(dir + "/model.safetensors.index.json", data, size);
  try {
    const Checkpoint checkpoint = Checkpoint::open_dir(dir);
    for (const std::string& name : checkpoint.names()) {
      const std::string& file = checkpoint.file_of(name);
      FUZZ_CHECK(file.rfind(dir + "/", 0) == 0 && file.find("/..") == std::string::npos,
                 name + " comes from " + file + ", outside the directory");
      const TensorView& view = checkpoint.tensor(name);
      FUZZ_CHECK(view.name == name && view.byte_size == 4, name);
    }
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(fuzz::names_file(e.what(), dir), std::string("the error names neither file nor directory: ") + e.what());
  }
  return 0;
}
