/// @file sample_kernels.cuh
/// @brief Chapter 08: the sampler (sampler.hpp) on the GPU, so that a sampled chat
/// token costs the decode step one small kernel and a 20-byte copy back, not the (V)
/// logits' copy (128 KB for Bielik) and a host pass over them.
///
/// The same steps as Sampler::sample_with_uniform, in the same order, with the draw `u`
/// made on the host by the same seeded generator (Sampler::draw_uniform): greedy is the
/// lowest index of the largest logit; with nothing to cut (top_k <= 0 or >= V, top_p = 1)
/// the draw walks the softmax in id order; with top-k (2..kGpuSamplerMaxTopK) the k most
/// likely tokens are ranked (probability descending, lower id first on a tie), their
/// probabilities normalized, top-p cut, renormalized and walked. The probabilities are
/// doubles from exp() as on the CPU. The ranked lists' sums are made by one thread in
/// the CPU's order, so they are the CPU's sums up to the last bit of exp(); the
/// unranked walk sums in 1024 chunks, not one by one, so its running sum differs from
/// the CPU's by rounding. Either way a token can differ from the CPU's only when u falls
/// within ~1e-15 of the border between two tokens. (One more difference, never drawn:
/// the top k are chosen by logit, so among tokens whose probability underflows to 0 the
/// kernel may keep other ones than the CPU's id order would.)
///
/// One block of kSampleThreads threads:
///  1. the largest logit, and the first NaN or +inf (the CPU sampler throws on those);
///     the logits are copied into shared memory on the way when they fit;
///  2. top-k: a shortlist, every token within 0.5, 1, 2, ... or 64 of the largest logit
///     (the nearest distance that holds at least k and at most kGpuSamplerMaxTopK tokens),
///     counted in registers and gathered in id order; or, when no distance gives one (a
///     flat distribution, a large k), the k-th largest logit by radix select (four passes
///     over the logits' bits, 8 bits a pass, a histogram per warp in shared memory, the
///     lanes of a warp that share a bin counted by one of them) and the k tokens gathered
///     in id order (ties at the threshold: the lowest ids, as the CPU's sort keeps them);
///     then the candidates ranked by a bitonic sort in shared memory, the first k kept;
///  3. the draw.
/// Top-p over every token (no top-k, or k >= V) ranks the min(V, kGpuSamplerMaxTopK) most
/// likely tokens (the radix select and the sort of step 2) and walks them as
/// Sampler::candidates does: the running sum of weight / (the mass of all V) until it
/// reaches top_p. The mass is summed in chunks, not in id order one by one, so the cut
/// can differ from the CPU's only where that running sum lies within rounding of top_p.
/// When the ranked tokens do not reach top_p (a flat distribution: a nucleus of more
/// than kGpuSamplerMaxTopK tokens), the kernel draws nothing and says so
/// (GpuSampleStatus::kNucleusBeyondRanked): the caller samples on the host, from the
/// same logits with the same u. A top-k above kGpuSamplerMaxTopK stays on the host
/// (gpu_sampler_supports says so).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "sampler.hpp"

namespace bielik {

/// The largest top_k the GPU sampler ranks in shared memory.
constexpr int kGpuSamplerMaxTopK = 1024;

/// What the kernel reports (SampleResult::status).
enum class GpuSampleStatus : int32_t {
  kOk = 0,
  kBadLogit = 1,    ///< a NaN or +inf logit; SampleResult::bad_index is the first, bad_is_nan which
  kAllInfinite = 2,  ///< every logit is -inf
  /// top-p over every token: the nucleus holds more than kGpuSamplerMaxTopK tokens, none
  /// drawn; the caller samples on the host (sample_needs_host)
  kNucleusBeyondRanked = 3
};

/// The kernel's output, copied back to the host in one piece.
struct SampleResult {
  int32_t token = -1;
  int32_t status = 0;  ///< a GpuSampleStatus
  int32_t bad_index = -1;
  int32_t bad_is_nan = 0;
  int32_t shortlisted = 0;  ///< top-k: the tokens the shortlist ranked (0: the radix select found the k)
};

/// The points gpu_sample's timeline stamps (%globaltimer, ns), in kernel order. Greedy
/// and the unranked walk go from kLargestFound straight to kDrawn (the stamps between
/// stay as they were).
enum class SampleTimelineEvent : int {
  kStart = 0,
  kLargestFound,    ///< step 1 done: the largest logit (and the logits in shared memory)
  kThresholdFound,  ///< top-k: the k-th largest logit found by the radix select
  kGathered,        ///< top-k: the k candidates in shared memory, in id order
  kRanked,          ///< top-k: the bitonic sort done
  kDrawn            ///< the token written
};
constexpr int kSampleTimelineEvents = 6;

/// Whether gpu_sample runs these options for a vocabulary of V (otherwise the caller
/// samples on the host): greedy, the unranked softmax, top-k up to kGpuSamplerMaxTopK
/// with any top-p, or top-p over every token (which may still leave a draw to the host:
/// sample_needs_host).
bool gpu_sampler_supports(const SamplerOptions& options, int V);

/// Samples one token from `logits` (V, device) into `result` (device), with the draw
/// `*uniform` (device, in [0, 1); ignored when greedy). Throws std::invalid_argument for
/// options gpu_sampler_supports refuses, or V <= 0. Measurement only: `timeline` (device,
/// kSampleTimelineEvents values) receives the time of each SampleTimelineEvent reached.
void gpu_sample(SampleResult* result, const float* logits, int V, const SamplerOptions& options,
                const double* uniform, cudaStream_t stream, unsigned long long* timeline = nullptr);

/// Whether gpu_sample left this draw to the host: top-p over every token with a nucleus
/// of more than kGpuSamplerMaxTopK tokens. The caller then samples the same logits on the
/// host with the same u (Sampler::sample_with_uniform).
inline bool sample_needs_host(const SampleResult& result) {
  return result.status == int32_t(GpuSampleStatus::kNucleusBeyondRanked);
}

/// Throws std::invalid_argument, worded as the CPU sampler's, when a result reports a
/// bad logit, and std::logic_error when it left the draw to the host (ask
/// sample_needs_host first); returns the token otherwise.
int32_t checked_token(const SampleResult& result);

}  // namespace bielik
