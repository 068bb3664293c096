// Chapter 08, CPU: the safetensors reader and the Checkpoint directory loader, on small
// files this test writes itself, good ones and every kind of broken one.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "model_config.hpp"
#include "safetensors.hpp"
#include "test_support.hpp"

using namespace bielik;
using nlohmann::json;

namespace {


void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(out.good());
}

// The 8-byte little-endian length, then the header, then the data: the whole format.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = char((n >> (8 * i)) & 0xFF);
  return bytes + header + data;
}

// A tiny writer: tensors laid out back to back in the order given.
struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
std::string make_file(const std::vector<Tensor>& tensors, const json& metadata = nullptr) {
  json header = json::object();
  std::string data;
  for (const Tensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  return safetensors_bytes(header.dump(), data);
}

std::string bf16_bytes(const std::vector<uint16_t>& bits) {
  std::string bytes;
  for (uint16_t b : bits) bytes += char(b & 0xFF), bytes += char(b >> 8);
  return bytes;
}


}  // namespace

TEST_CASE("safetensors: a good file reads back names, dtypes, shapes and bytes", "[ch08][cpu]") {
  TempDir dir;
  std::vector<uint16_t> weight = {0x3F80, 0xBF80, 0x4000, 0x0000, 0x7F80, 0x3E00};  // 1, -1, 2, 0, inf, 0.125
  std::string ints(12, '\0');
  int32_t values[3] = {7, -3, 1 << 20};
  std::memcpy(&ints[0], values, 12);
  write_bytes(dir.file("a.safetensors"),
              make_file({{"w", "BF16", {2, 3}, bf16_bytes(weight)}, {"ids", "I32", {3}, ints}, {"empty", "F32", {0, 5}, ""},
                         {"scalar", "F32", {}, std::string("\x00\x00\x80\x3f", 4)}},
                        {{"format", "pt"}}));

  SafetensorsFile file = SafetensorsFile::open(dir.file("a.safetensors"));
  REQUIRE(file.names() == std::vector<std::string>{"empty", "ids", "scalar", "w"});  // __metadata__ skipped
  REQUIRE(file.metadata().at("format") == "pt");
  const TensorView& w = file.tensor("w");
  REQUIRE(w.dtype == "BF16");
  REQUIRE(w.shape == std::vector<int64_t>{2, 3});
  REQUIRE(w.numel() == 6);
  REQUIRE(w.byte_size == 12);
  std::vector<uint16_t> read(6);
  std::memcpy(read.data(), w.data, 12);
  REQUIRE(read == weight);
  int32_t read_ints[3];
  std::memcpy(read_ints, file.tensor("ids").data, 12);
  REQUIRE(read_ints[2] == (1 << 20));
  REQUIRE(file.tensor("empty").numel() == 0);
  REQUIRE(file.tensor("scalar").numel() == 1);
  float one;
  std::memcpy(&one, file.tensor("scalar").data, 4);
  REQUIRE(one == 1.0f);

  // Moving the file keeps the views (and their data pointers) valid.
  const uint8_t* before = w.data;
  SafetensorsFile moved = std::move(file);
  REQUIRE(moved.tensor("w").data == before);
  REQUIRE(moved.contains("ids"));
  REQUIRE_FALSE(moved.contains("nope"));
  std::string missing = error_of([&] { moved.tensor("nope"); });
  REQUIRE(contains(missing, "a.safetensors"));
  REQUIRE(contains(missing, "'nope'"));
}

TEST_CASE("safetensors: missing, truncated and malformed files fail with the file and the problem", "[ch08][cpu]") {
  TempDir dir;
  std::string good = make_file({{"w", "F32", {2, 2}, std::string(16, '\1')}});
  struct Case {
    const char* what;
    std::string bytes;
    const char* expected;
  };
  std::vector<Case> cases = {
      {"empty file", "", "too short for the 8-byte header length"},
      {"5 bytes", "abcde", "too short"},
      {"header longer than the file", good.substr(0, 20), "truncated file"},
      {"data cut short", good.substr(0, good.size() - 3), "reach past the data section"},
      {"absurd header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "implausible"},
      {"header not JSON", safetensors_bytes("{\"w\": {\"dtype\": ", ""), "malformed header JSON"},
      {"a number past double's range", safetensors_bytes("{\"w\": 4e335}", ""), "malformed header JSON"},
      {"header JSON not an object", safetensors_bytes("[1, 2]", ""), "not an object"},
      {"unknown dtype", safetensors_bytes(R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", "ab"),
       "unknown dtype 'Q4_K'"},
      {"negative shape", safetensors_bytes(R"({"w":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "ab"),
       "negative dimension"},
      {"offsets past the data", safetensors_bytes(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "ab"),
       "reach past the data section"},
      {"reversed offsets", safetensors_bytes(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[2,0]}})", "ab"),
       "end before they begin"},
      {"size disagrees with shape", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x')),
       "needs 12 bytes but data_offsets give 8"},
      {"overflowing shape",
       safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
       "more than 2^64"},
      {"overlapping tensors",
       safetensors_bytes(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U8","shape":[3],"data_offsets":[2,5]}})",
                         "abcde"),
       "overlap"},
      {"missing key", safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2]}})", "ab"), "no 'data_offsets'"},
      {"bad offsets type", safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "ab"),
       "'data_offsets' must be two"},
  };
  for (const Case& c : cases) {
    std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    std::string message = error_of([&] { SafetensorsFile::open(path); });
    INFO("case: " << c.what << "\nmessage: " << message);
    CHECK(contains(message, path));
    CHECK(contains(message, c.expected));
  }

  std::string message = error_of([&] { SafetensorsFile::open(dir.file("absent.safetensors")); });
  REQUIRE(contains(message, "absent.safetensors"));
  REQUIRE(contains(message, "No such file"));

  // The control case: the good bytes do open (so the failures above are the edits).
  write_bytes(dir.file("good.safetensors"), good);
  REQUIRE(SafetensorsFile::open(dir.file("good.safetensors")).tensor("w").numel() == 4);
}

TEST_CASE("Checkpoint: one file, shards with an index, checked dtype and shape", "[ch08][cpu]") {
  SECTION("single model.safetensors") {
    TempDir dir;
    write_bytes(dir.file("model.safetensors"),
                make_file({{"model.layers.3.self_attn.q_proj.weight", "BF16", {4, 2}, std::string(16, '\0')}}));
    Checkpoint checkpoint = Checkpoint::open_dir(dir.path);
    const auto& q = checkpoint.tensor_checked("model.layers.3.self_attn.q_proj.weight", "BF16", {4, 2});
    REQUIRE(q.numel() == 8);

    std::string shape_error = error_of([&] { checkpoint.tensor_checked("model.layers.3.self_attn.q_proj.weight", "BF16", {4, 4}); });
    REQUIRE(shape_error == dir.file("model.safetensors") +
                               ": tensor 'model.layers.3.self_attn.q_proj.weight' has shape (4, 2), expected (4, 4)");
    std::string dtype_error = error_of([&] { checkpoint.tensor_checked("model.layers.3.self_attn.q_proj.weight", "F32", {4, 2}); });
    REQUIRE(contains(dtype_error, "has dtype BF16, expected F32"));
    std::string missing = error_of([&] { checkpoint.tensor("lm_head.weight"); });
    REQUIRE(contains(missing, dir.path));
    REQUIRE(contains(missing, "'lm_head.weight'"));
  }
  SECTION("sharded with model.safetensors.index.json") {
    TempDir dir;
    write_bytes(dir.file("model-00001-of-00002.safetensors"), make_file({{"a", "F32", {1}, "abcd"}, {"b", "U8", {2}, "xy"}}));
    write_bytes(dir.file("model-00002-of-00002.safetensors"), make_file({{"c", "I32", {2}, std::string(8, '\3')}}));
    json index = {{"metadata", {{"total_size", 14}}},
                  {"weight_map", {{"a", "model-00001-of-00002.safetensors"},
                                  {"b", "model-00001-of-00002.safetensors"},
                                  {"c", "model-00002-of-00002.safetensors"}}}};
    write_bytes(dir.file("model.safetensors.index.json"), index.dump());
    Checkpoint checkpoint = Checkpoint::open_dir(dir.path);
    REQUIRE(checkpoint.names() == std::vector<std::string>{"a", "b", "c"});
    REQUIRE(std::string(reinterpret_cast<const char*>(checkpoint.tensor("b").data), 2) == "xy");
    REQUIRE(checkpoint.file_of("c") == dir.file("model-00002-of-00002.safetensors"));
    REQUIRE(checkpoint.tensor_checked("c", "I32", {2}).byte_size == 8);

    // The index names a tensor its shard lacks.
    index["weight_map"]["d"] = "model-00002-of-00002.safetensors";
    write_bytes(dir.file("model.safetensors.index.json"), index.dump());
    std::string message = error_of([&] { Checkpoint::open_dir(dir.path); });
    REQUIRE(contains(message, "model.safetensors.index.json"));
    REQUIRE(contains(message, "'d'"));

    // The index names a shard that is not there.
    index["weight_map"]["d"] = "model-00003-of-00002.safetensors";
    write_bytes(dir.file("model.safetensors.index.json"), index.dump());
    message = error_of([&] { Checkpoint::open_dir(dir.path); });
    REQUIRE(contains(message, "model-00003-of-00002.safetensors"));

    write_bytes(dir.file("model.safetensors.index.json"), "{\"weight_map\": ");
    REQUIRE(contains(error_of([&] { Checkpoint::open_dir(dir.path); }), "malformed JSON"));
    write_bytes(dir.file("model.safetensors.index.json"), "{}");
    REQUIRE(contains(error_of([&] { Checkpoint::open_dir(dir.path); }), "no 'weight_map'"));
  }
  SECTION("empty directory") {
    TempDir dir;
    std::string message = error_of([&] { Checkpoint::open_dir(dir.path); });
    REQUIRE(contains(message, dir.path));
    REQUIRE(contains(message, "model.safetensors"));
  }
}

// Optional (required with BIELIK_REQUIRE_SMOLLM2=1, as CI sets it): the SmolLM2 checkpoint
// written by scripts/prepare_smollm2.py, read through Checkpoint with every tensor's shape
// checked against its config.json.
TEST_CASE("Checkpoint: prepared SmolLM2-135M-Instruct has every tensor its config implies (if prepared)",
          "[ch08][cpu]") {
  const char* env = std::getenv("BIELIK_SMOLLM2_DIR");
  std::string dir = env ? env : std::string(BIELIK_SOURCE_DIR) + "/models/smollm2-135m-instruct";
  if (!std::ifstream(dir + "/config.json").good()) {
    if (smollm2_required()) {  // CI prepared it: a missing file is a failed preparation, not a skip
      FAIL("BIELIK_REQUIRE_SMOLLM2 is set but " << dir << "/config.json is missing (run `make models`)");
    }
    WARN("no " << dir << "/config.json: run `python scripts/prepare_smollm2.py` to test a real checkpoint");
    return;
  }
  ModelConfig c = load_model_config(dir + "/config.json");
  Checkpoint checkpoint = Checkpoint::open_dir(dir);
  int64_t C = c.hidden_size, F = c.intermediate_size, D = c.head_dim, V = c.vocab_size;
  int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  size_t expected_count = 2 + 9 * size_t(c.num_hidden_layers) + (c.tie_word_embeddings ? 0 : 1);
  REQUIRE(checkpoint.names().size() == expected_count);
  checkpoint.tensor_checked("model.embed_tokens.weight", "BF16", {V, C});
  checkpoint.tensor_checked("model.norm.weight", "BF16", {C});
  REQUIRE(checkpoint.contains("lm_head.weight") == !c.tie_word_embeddings);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    checkpoint.tensor_checked(p + "self_attn.q_proj.weight", "BF16", {H * D, C});
    checkpoint.tensor_checked(p + "self_attn.k_proj.weight", "BF16", {Hkv * D, C});
    checkpoint.tensor_checked(p + "self_attn.v_proj.weight", "BF16", {Hkv * D, C});
    checkpoint.tensor_checked(p + "self_attn.o_proj.weight", "BF16", {C, H * D});
    checkpoint.tensor_checked(p + "mlp.gate_proj.weight", "BF16", {F, C});
    checkpoint.tensor_checked(p + "mlp.up_proj.weight", "BF16", {F, C});
    checkpoint.tensor_checked(p + "mlp.down_proj.weight", "BF16", {C, F});
    checkpoint.tensor_checked(p + "input_layernorm.weight", "BF16", {C});
    checkpoint.tensor_checked(p + "post_attention_layernorm.weight", "BF16", {C});
  }
}
