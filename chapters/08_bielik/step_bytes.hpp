/// @file step_bytes.hpp
/// @brief What each piece of Bielik's decode step reads and moves, in bytes: the sizes the
/// synthetic step benchmarks (bench_layer_chain, bench_megakernel) read so that they
/// stream exactly the real step's weights, and the activations they pass between phases.
#pragma once

#include <cstddef>

namespace bielik {
namespace step_bytes {

// Bielik-1.5B-v3.0 (models/bielik-1.5b-v3-config.json), bf16.
constexpr size_t kHidden = 1536, kIntermediate = 8960, kKvWidth = 2 * 128, kVocab = 32000;
constexpr int kLayers = 32;
constexpr size_t kQkvBytes = (kHidden + 2 * kKvWidth) * kHidden * 2 + (kHidden + 2 * kKvWidth) * 2;  // + bias
constexpr size_t kOBytes = kHidden * kHidden * 2;
constexpr size_t kGateUpBytes = 2 * kIntermediate * kHidden * 2;
constexpr size_t kDownBytes = kHidden * kIntermediate * 2;
constexpr size_t kLmHeadBytes = kVocab * kHidden * 2;

// The step's activations in 16-byte chunks: x (C bf16), q + k + v ((H + 2 Hkv) D), the
// attention's output (H D, as many as x), gate/up's (F), the logits (V floats). Each
// attention block reads its head's q and the new key and value (3 D).
constexpr int kX = int(kHidden * 2 / 16), kQkv = int((kHidden + 2 * kKvWidth) * 2 / 16);
constexpr int kHeadInputs = 3 * 128 * 2 / 16, kF = int(kIntermediate * 2 / 16), kLogits = int(kVocab * 4 / 16);

}  // namespace step_bytes
}  // namespace bielik
