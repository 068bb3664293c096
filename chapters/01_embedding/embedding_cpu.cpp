// The reference: read it first. Every GPU version must produce exactly these rows
// (an embedding lookup is a copy, so the GPU result is bit-exact, not approximate).
#include <stdexcept>
#include <string>

#include "embedding.cuh"

namespace bielik {

void embedding_cpu(float* out, const float* table, const int32_t* token_ids, int T, int C, int V) {
  for (int t = 0; t < T; ++t) {
    int32_t id = token_ids[t];
    if (id < 0 || id >= V) {
      throw std::out_of_range("embedding_cpu: token id " + std::to_string(id) + " at position " +
                              std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
    const float* row = table + static_cast<size_t>(id) * C;
    for (int c = 0; c < C; ++c) out[static_cast<size_t>(t) * C + c] = row[c];
  }
}

}  // namespace bielik
