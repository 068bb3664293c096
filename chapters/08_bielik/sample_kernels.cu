// The sampler on the GPU (sample_kernels.cuh says what and why).
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "globaltimer.cuh"
#include "sample_kernels.cuh"

namespace bielik {

namespace {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kSortSlots = kGpuSamplerMaxTopK;  // the bitonic sort's width, a power of two
static_assert((kSortSlots & (kSortSlots - 1)) == 0 && kSortSlots <= kSampleThreads, "one slot a thread");
constexpr unsigned kFullMask = 0xffffffffu;
// The logits are copied into shared memory by the first pass when they fit this (Bielik's
// 32000 take 129 KB), so the passes after it read shared memory instead of L2. Measured
// on the H200 (2026-12-02): the top-k path took ~90 us a token reading L2 in every pass,
// one dependent load after another.
constexpr size_t kMaxCachedLogitBytes = size_t(160) << 10;

// Where logit i sits in the shared copy: one unused float after every 32. The passes in id
// order give each thread a run of consecutive ids (Bielik: 32), so without the gap the 32
// lanes of a warp would read 32 floats apart, all in one of the 32 banks, one lane at a
// time; with it, lane l's j-th read falls in bank (l + j) % 32. Reads across the threads
// (i = thread + 1024 n) stay in 32 different banks.
__host__ __device__ constexpr int padded_index(int i) { return i + i / 32; }
__host__ __device__ constexpr size_t cached_logit_bytes(int V) { return size_t(padded_index(V)) * sizeof(float); }

enum class Mode : int { kGreedy = 0, kUnranked = 1, kTopK = 2, kTopP = 3 };

// Logits a thread loads before it uses one (step 1).
constexpr int kLoadBatch = 16;

// Top-k's shortlist: the distances below the largest logit it tries first, 0.5 * 2^j,
// and how many times it may narrow down between two of them.
constexpr int kDistances = 8;
constexpr int kShortlistRefinements = 2;
constexpr int kShortlistMaxTopK = kGpuSamplerMaxTopK / 4;
__device__ __forceinline__ float shortlist_distance(int j) { return 0.5f * float(1 << j); }

// %globaltimer at `event`, by thread 0, after the barrier that ends the step before
// (every caller stands right after one, or where only thread 0's work remains).
__device__ __forceinline__ void stamp(unsigned long long* timeline, SampleTimelineEvent event) {
  if (timeline != nullptr && threadIdx.x == 0) timeline[int(event)] = globaltimer_ns();
}

// A key whose unsigned order is the float order (NaN excluded beforehand): the sign bit
// flipped for positives, every bit for negatives. -0 is made +0 first (x + 0.0f), so
// that the two zeros, equal as logits and as probabilities, are one key.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(v + 0.0f);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The inclusive prefix sum over a warp's lanes in lane order, and the exclusive one
// (what the lanes below hold; shuffled, not subtracted, so that doubles are exact).
// Every lane must call them.
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T value, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const T below = __shfl_up_sync(kFullMask, value, offset);
    if (lane >= offset) value += below;
  }
  return value;
}
template <typename T>
__device__ __forceinline__ T exclusive_from_inclusive(T inclusive, int lane) {
  const T below = __shfl_up_sync(kFullMask, inclusive, 1);
  return lane == 0 ? T(0) : below;
}

// The exclusive prefix sum over the block's threads in thread order; *total (shared)
// receives the sum of all. Every thread must call it. warp_sums: (kSampleWarps) shared.
template <typename T>
__device__ T block_exclusive_scan(T value, T* warp_sums, T* total) {
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const T inclusive = warp_inclusive_scan(value, lane);
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {  // the warps' totals, scanned the same way by warp 0
    const T running = warp_inclusive_scan(warp_sums[lane], lane);
    warp_sums[lane] = exclusive_from_inclusive(running, lane);
    if (lane == 31) *total = running;
  }
  __syncthreads();
  const T result = warp_sums[warp] + exclusive_from_inclusive(inclusive, lane);
  __syncthreads();  // warp_sums may be reused by the next scan
  return result;
}

struct Candidate {
  double weight;  // exp((logit - max) / temperature); -1 for an unused slot
  int32_t id;
};

// Ranked order: more likely first, the lower id first on a tie (Sampler::candidates).
__device__ __forceinline__ bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.weight != b.weight ? a.weight > b.weight : a.id < b.id;
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(SampleResult* result,
                  const float* __restrict__ logits,  // (V)
                  int V, Mode mode, float temperature, int top_k, float top_p,
                  const double* uniform,  // (1) u in [0, 1)
                  bool cache_logits,      // copy them into the dynamic shared memory (padded_index)
                  unsigned long long* timeline) {  // (kSampleTimelineEvents) or nullptr
  extern __shared__ float cached[];  // (padded_index(V)) with cache_logits
  __shared__ int first_bad, any_finite, found;
  __shared__ float warp_max[kSampleWarps];
  __shared__ double double_sums[kSampleWarps];
  __shared__ int int_sums[kSampleWarps];
  __shared__ double double_total;
  __shared__ int int_total, int_total_2;
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  if (tid == 0) {
    first_bad = INT_MAX;
    any_finite = 0;
    found = INT_MAX;
  }
  __syncthreads();

  stamp(timeline, SampleTimelineEvent::kStart);

  // 1. The largest logit; the first NaN or +inf, which the CPU sampler refuses. Each
  //    thread asks for kLoadBatch logits before it looks at any: one trip to L2 for them
  //    all, where a loop of one load at a time waits for each (Bielik: 32 trips a thread).
  float largest = -INFINITY;
  int bad = INT_MAX, finite = 0;
  for (int base = 0; base < V; base += kSampleThreads * kLoadBatch) {
    float batch[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int i = base + j * kSampleThreads + tid;
      batch[j] = i < V ? logits[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int i = base + j * kSampleThreads + tid;
      if (i >= V) break;
      const float l = batch[j];
      if (cache_logits) cached[padded_index(i)] = l;
      if (isnan(l) || l == INFINITY) {
        bad = min(bad, i);
      } else {
        largest = fmaxf(largest, l);
        finite |= l != -INFINITY;
      }
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) largest = fmaxf(largest, __shfl_xor_sync(kFullMask, largest, offset));
  if (lane == 0) warp_max[warp] = largest;
  if (bad != INT_MAX) atomicMin(&first_bad, bad);
  if (finite) atomicOr(&any_finite, 1);
  __syncthreads();
  if (first_bad != INT_MAX || !any_finite) {
    if (tid == 0) {
      SampleResult r;
      r.status = int32_t(first_bad != INT_MAX ? GpuSampleStatus::kBadLogit : GpuSampleStatus::kAllInfinite);
      r.bad_index = first_bad != INT_MAX ? first_bad : -1;
      r.bad_is_nan = first_bad != INT_MAX && isnan(logits[first_bad]);
      *result = r;
    }
    return;
  }
  if (warp == 0) {
    float m = warp_max[lane];
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
    if (lane == 0) warp_max[0] = m;
  }
  __syncthreads();
  const float max_logit = warp_max[0];
  stamp(timeline, SampleTimelineEvent::kLargestFound);
  auto logit = [&](int i) { return cache_logits ? cached[padded_index(i)] : logits[i]; };  // (after the barrier above)

  if (mode == Mode::kGreedy) {  // the first index of the largest logit, as std::max_element
    for (int i = tid; i < V; i += kSampleThreads) {
      if (logit(i) == max_logit) {
        atomicMin(&found, i);
        break;
      }
    }
    __syncthreads();
    if (tid == 0) *result = SampleResult{found, 0, -1, 0};
    stamp(timeline, SampleTimelineEvent::kDrawn);
    return;
  }

  const double u = *uniform;
  const double max_double = double(max_logit);
  const int chunk = (V + kSampleThreads - 1) / kSampleThreads;  // contiguous ids a thread, for id order
  const int begin = min(V, tid * chunk), end = min(V, begin + chunk);

  if (mode == Mode::kUnranked) {
    // 2a. Nothing to cut: the softmax walked in id order. Each thread sums its chunk,
    //     the block scans the sums, and the thread whose span holds the target walks it.
    const double temperature_double = double(temperature);
    auto weight = [&](int i) { return exp((double(logit(i)) - max_double) / temperature_double); };
    double local = 0;
    int first_possible = INT_MAX, last_possible = -1;
    for (int i = begin; i < end; ++i) {
      const double w = weight(i);
      local += w;
      if (w > 0) {
        first_possible = min(first_possible, i);
        last_possible = i;
      }
    }
    const double before = block_exclusive_scan(local, double_sums, &double_total);
    const double target = u * double_total;
    // The first token whose running sum passes the target: in the one thread whose span
    // [before, before + local) holds the target, which walks it. Its walk sums in another
    // order than the scan did, so it may fall short by rounding; then the answer is the
    // first token with a weight after it, which every later thread offers.
    if (local > 0 && target < before + local) {
      if (before <= target) {
        double cumulative = before;
        for (int i = begin; i < end; ++i) {
          cumulative += weight(i);
          if (target < cumulative) {
            atomicMin(&found, i);
            break;
          }
        }
      } else {
        atomicMin(&found, first_possible);
      }
    }
    // The target in the rounding slack of the sum: the last token with a weight.
    for (int offset = 16; offset > 0; offset /= 2) {
      last_possible = max(last_possible, __shfl_xor_sync(kFullMask, last_possible, offset));
    }
    if (lane == 0) int_sums[warp] = last_possible;
    __syncthreads();
    if (tid == 0) {
      int last = -1;
      for (int w = 0; w < kSampleWarps; ++w) last = max(last, int_sums[w]);
      *result = SampleResult{found != INT_MAX ? found : last, 0, -1, 0};
    }
    stamp(timeline, SampleTimelineEvent::kDrawn);
    return;
  }

  // 2b. Top-k, and top-p over every token. Two ways to the k most likely tokens; both
  //     leave candidates in `ranked` for one bitonic sort (step 4), and the first k after
  //     it are the answer. Top-p over every token ranks the most likely
  //     min(V, kSortSlots) (the radix select) and cuts the nucleus from them (step 5).
  // One shared buffer for the phases that never overlap (48 KB of static shared memory is
  // the limit): the radix select's histograms, then the candidates.
  __shared__ __align__(16) unsigned char scratch[kSampleWarps * 256 * sizeof(unsigned)];
  static_assert(kSortSlots * sizeof(Candidate) <= sizeof(scratch), "the candidates fit the histograms' space");
  Candidate* ranked = reinterpret_cast<Candidate*>(scratch);  // (kSortSlots)
  const double inverse_temperature = 1.0 / double(temperature);
  auto candidate = [&](int i) {
    return Candidate{exp((double(logit(i)) - max_double) * inverse_temperature), int32_t(i)};
  };
  // Top-p over every token cuts where the running sum of weight / (the mass of all V)
  // reaches top_p: that mass first, each thread's chunk in id order, then the chunks'
  // sums (the CPU adds all V one by one in id order: the two differ by rounding).
  const int select_k = mode == Mode::kTopP ? min(V, kSortSlots) : top_k;
  double all_mass = 0;
  if (mode == Mode::kTopP) {
    double local = 0;
    for (int i = begin; i < end; ++i) local += candidate(i).weight;
    block_exclusive_scan(local, double_sums, &double_total);
    all_mass = double_total;  // (read after the scan's last barrier; step 5 reuses double_total)
    // No weight exceeds the largest's, exp(0) = 1, so the select_k most likely hold at most
    // select_k / all_mass of it. Below top_p (with a margin for the running sum's rounding)
    // the nucleus lies past them whatever they are: a flat distribution goes to the host
    // now, without the ~70 us of selecting and ranking (step 5 would say the same).
    if (select_k < V && double(select_k) * (1.0 + 1e-9) < double(top_p) * all_mass) {
      if (tid == 0) *result = SampleResult{-1, int32_t(GpuSampleStatus::kNucleusBeyondRanked), -1, 0, 0};
      stamp(timeline, SampleTimelineEvent::kDrawn);
      return;
    }
  }

  //  The short way: a shortlist. The k most likely are the tokens closest to the largest
  //  logit. Every thread counts its tokens within kDistances distances of it (0.5, 1, 2,
  //  ... 64; counters in registers), the block adds the counts up, and the nearest
  //  distance that takes in at least k tokens, if it takes in at most kSortSlots, gives
  //  the shortlist: every token that close, gathered in id order. When it takes in too
  //  many, the same count runs again on the distances between it and the one before
  //  (eight steps between them, only tokens in that range counted), up to
  //  kShortlistRefinements times. Ties with the k-th are all in or all out (one distance
  //  for equal logits), and the sort ranks them by id as the CPU does. Only for k up to
  //  kShortlistMaxTopK (256): a larger k leaves too narrow a window, [k, kSortSlots], for
  //  a distance to land in.
  __shared__ int within_counts[kDistances];
  float lower = -1.0f, upper = shortlist_distance(kDistances - 1);  // counting the range (lower, upper]
  int lower_count = 0;  // tokens within `lower` (fewer than k)
  int listed = 0;       // candidates in `ranked`: the shortlist's size, or k after the radix select
  float shortlist_within = -1.0f;
  for (int round = 0; round <= kShortlistRefinements && mode == Mode::kTopK && top_k <= kShortlistMaxTopK;
       ++round) {
    // (lower, upper and the counts are the same in every thread: the loop is block-uniform)
    const float step = (upper - lower) / float(kDistances);
    auto distance_at = [&](int m) { return round == 0 ? shortlist_distance(m) : fmaf(step, float(m + 1), lower); };
    if (tid < kDistances) within_counts[tid] = 0;
    __syncthreads();
    int within[kDistances] = {};
    for (int i = begin; i < end; ++i) {
      const float d = max_logit - logit(i);  // (-inf logits: +inf, never counted)
      if (d > lower && d <= upper) {
#pragma unroll
        for (int m = 0; m < kDistances; ++m) within[m] += d <= distance_at(m);
      }
    }
#pragma unroll
    for (int m = 0; m < kDistances; ++m) {
      const int warp_total = __reduce_add_sync(kFullMask, within[m]);
      if (lane == 0 && warp_total > 0) atomicAdd(&within_counts[m], warp_total);
    }
    __syncthreads();
    int m = 0;
    while (m < kDistances && lower_count + within_counts[m] < top_k) ++m;
    if (m == kDistances) break;  // (the first round only: fewer than k tokens within 64)
    if (lower_count + within_counts[m] <= kSortSlots) {
      listed = lower_count + within_counts[m];
      shortlist_within = distance_at(m);
      break;
    }
    const float next_upper = distance_at(m);
    if (m > 0) {
      lower = distance_at(m - 1);
      lower_count += within_counts[m - 1];
    }
    upper = next_upper;
    __syncthreads();  // every thread has read within_counts before the next round clears it
  }
  if (listed > 0) {
    stamp(timeline, SampleTimelineEvent::kThresholdFound);
    int here = 0;
    for (int i = begin; i < end; ++i) here += max_logit - logit(i) <= shortlist_within;
    int slot = block_exclusive_scan(here, int_sums, &int_total);
    for (int i = begin; i < end; ++i) {
      if (max_logit - logit(i) <= shortlist_within) ranked[slot++] = candidate(i);
    }
  } else {
    // The long way, when no distance gives a short enough list (a flat distribution, a
    // large k): the k-th largest logit's key by radix select, 8 bits a pass from the top.
    // Each pass counts, among the keys that match the bits fixed so far, how many fall
    // in each of the 256 values of the next 8 bits (a histogram per warp, so that only
    // a warp's own lanes write it), then fixes the bits of the bin that holds the k-th.
    // Logits are alike in their top bits (sign and exponent), so in the first passes
    // most lanes of a warp fall in one bin: the lanes that share a bin find each other
    // (__match_any_sync) and the lowest of them adds their count, one write a bin.
    auto histogram = reinterpret_cast<unsigned (*)[256]>(scratch);
    __shared__ unsigned bins[256];
    __shared__ uint32_t selected_prefix;
    __shared__ int selected_remaining;
    uint32_t prefix = 0, mask = 0;
    int remaining = select_k;  // the rank of the wanted key among those matching `prefix`
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < kSampleWarps * 256; i += kSampleThreads) (&histogram[0][0])[i] = 0;
      __syncthreads();
      for (int first = tid - lane; first < V; first += kSampleThreads) {  // the same trips for a warp's lanes
        const int i = first + lane;
        unsigned bin = 256;  // not counted: past V, or not matching the bits fixed so far
        if (i < V) {
          const uint32_t key = order_key(logit(i));
          if ((key & mask) == prefix) bin = (key >> shift) & 255u;
        }
        const unsigned sharing = __match_any_sync(kFullMask, bin);
        // Only this warp writes its histogram, one lane a bin per trip: no atomic needed.
        if (bin < 256 && lane == __ffs(sharing) - 1) histogram[warp][bin] += unsigned(__popc(sharing));
      }
      __syncthreads();
      if (tid < 256) {
        unsigned sum = 0;
        for (int w = 0; w < kSampleWarps; ++w) sum += histogram[w][tid];
        bins[tid] = sum;
      }
      __syncthreads();
      if (warp == 0) {  // the bin that holds the remaining-th largest: lane l sums bins 255 - 8l .. 248 - 8l
        int counts[8], lane_total = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) lane_total += counts[j] = int(bins[255 - 8 * lane - j]);
        const int through = warp_inclusive_scan(lane_total, lane);  // keys in this lane's bins and every higher lane's
        int above = through - lane_total;  // keys in higher bins than this lane's
        if (above < remaining && remaining <= through) {  // exactly one lane
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (above + counts[j] >= remaining) {
              selected_prefix = prefix | (uint32_t(255 - 8 * lane - j) << shift);
              selected_remaining = remaining - above;
              break;
            }
            above += counts[j];
          }
        }
      }
      __syncthreads();
      prefix = selected_prefix;
      remaining = selected_remaining;
      mask |= 0xffu << shift;
    }
    // `prefix` is now the k-th largest key; `remaining` of the keys equal to it are kept,
    // the lowest ids (the CPU's tie order), after every key above it.
    stamp(timeline, SampleTimelineEvent::kThresholdFound);

    // The k tokens gathered in id order: thread t's chunk, the block's scans give each
    // thread where its tokens go.
    int above_here = 0, equal_here = 0;
    for (int i = begin; i < end; ++i) {
      const uint32_t key = order_key(logit(i));
      above_here += key > prefix;
      equal_here += key == prefix;
    }
    int above_slot = block_exclusive_scan(above_here, int_sums, &int_total);
    int equal_rank = block_exclusive_scan(equal_here, int_sums, &int_total_2);
    const int above_all = int_total;
    for (int i = begin; i < end; ++i) {
      const uint32_t key = order_key(logit(i));
      if (key > prefix) {
        ranked[above_slot++] = candidate(i);
      } else if (key == prefix) {
        if (equal_rank < remaining) ranked[above_all + equal_rank] = candidate(i);
        ++equal_rank;
      }
    }
    listed = select_k;
  }
  int sorted = 2;  // the sort's width: the power of two >= the candidates
  while (sorted < listed) sorted *= 2;
  if (tid >= listed && tid < sorted) ranked[tid] = Candidate{-1.0, INT_MAX};
  __syncthreads();
  stamp(timeline, SampleTimelineEvent::kGathered);

  // 4. Ranked by a bitonic sort (most likely first).
  for (int size = 2; size <= sorted; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      const int partner = tid ^ stride;
      if (tid < sorted && partner > tid) {
        const bool first_half_first = (tid & size) == 0;  // this pair's order in the merge
        const Candidate a = ranked[tid], b = ranked[partner];
        if (ranks_before(b, a) == first_half_first) {
          ranked[tid] = b;
          ranked[partner] = a;
        }
      }
      __syncthreads();
    }
  }

  stamp(timeline, SampleTimelineEvent::kRanked);

  // 5. Normalize, cut the nucleus, renormalize, draw: the CPU's sums, in its order, by
  //    one thread; the divisions (exact per element) by all.
  __shared__ int nucleus, beyond_ranked;
  if (mode == Mode::kTopP) {
    // Sampler::candidates' top-p over every token: the running sum of weight / all_mass
    // in ranked order until it reaches top_p, then the nucleus normalized by its own sum.
    if (tid == 0) {
      double cumulative = 0;
      int kept = 0;
      while (kept < listed && cumulative < double(top_p)) cumulative += ranked[kept++].weight / all_mass;
      // Not reached within the ranked tokens, and tokens are left: the nucleus goes on.
      beyond_ranked = cumulative < double(top_p) && listed < V;
      double mass = 0;
      for (int s = 0; s < kept; ++s) mass += ranked[s].weight;
      double_total = mass;
      nucleus = kept;
    }
    __syncthreads();
    if (beyond_ranked) {  // a flat distribution: the caller samples on the host (sample_needs_host)
      if (tid == 0) *result = SampleResult{-1, int32_t(GpuSampleStatus::kNucleusBeyondRanked), -1, 0, 0};
      stamp(timeline, SampleTimelineEvent::kDrawn);
      return;
    }
    if (tid < nucleus) ranked[tid].weight /= double_total;
    __syncthreads();
  } else {
    if (tid == 0) {
      double mass = 0;
      for (int s = 0; s < top_k; ++s) mass += ranked[s].weight;
      double_total = mass;
    }
    __syncthreads();
    if (tid < top_k) ranked[tid].weight /= double_total;
    __syncthreads();
    if (tid == 0) {
      int kept = top_k;
      if (top_p < 1.0f) {
        double cumulative = 0;
        kept = 0;
        while (kept < top_k && cumulative < double(top_p)) cumulative += ranked[kept++].weight;
        double mass = 0;
        for (int s = 0; s < kept; ++s) mass += ranked[s].weight;
        double_total = mass;
      }
      nucleus = kept;
    }
    __syncthreads();
    if (top_p < 1.0f && tid < nucleus) ranked[tid].weight /= double_total;
    __syncthreads();
  }
  if (tid == 0) {
    // u in the rounding slack of the sum: the last token with a weight, as the CPU's
    // Sampler (a top-k list may end in tokens of weight 0: -inf logits, exp underflow).
    int32_t token = ranked[0].id;
    double cumulative = 0;
    for (int s = 0; s < nucleus; ++s) {
      cumulative += ranked[s].weight;
      if (u < cumulative) {
        token = ranked[s].id;
        break;
      }
      if (ranked[s].weight > 0) token = ranked[s].id;
    }
    *result = SampleResult{token, 0, -1, 0, shortlist_within >= 0.0f ? listed : 0};
  }
  stamp(timeline, SampleTimelineEvent::kDrawn);
}

Mode mode_for(const SamplerOptions& o, int V) {
  if (o.temperature <= 0.0f || o.top_k == 1) return Mode::kGreedy;
  const bool every_token = o.top_k <= 0 || o.top_k >= V;
  if (every_token) return o.top_p >= 1.0f ? Mode::kUnranked : Mode::kTopP;
  return Mode::kTopK;
}

}  // namespace

bool gpu_sampler_supports(const SamplerOptions& o, int V) {
  if (V <= 0) return false;
  const Mode mode = mode_for(o, V);
  return mode != Mode::kTopK || (o.top_k >= 2 && o.top_k <= kGpuSamplerMaxTopK && o.top_k < V);
}

void gpu_sample(SampleResult* result, const float* logits, int V, const SamplerOptions& options,
                const double* uniform, cudaStream_t stream, unsigned long long* timeline) {
  if (V <= 0 || !result || !logits || !uniform) {
    throw std::invalid_argument("gpu_sample: needs V > 0 and the result, logits and uniform pointers");
  }
  if (!gpu_sampler_supports(options, V)) {
    throw std::invalid_argument("gpu_sample: top_k " + std::to_string(options.top_k) + " with top_p " +
                                std::to_string(options.top_p) + " ranks more than " +
                                std::to_string(kGpuSamplerMaxTopK) + " tokens; sample on the host");
  }
  // Room for the logits in shared memory, asked for once (above the 48 KB default).
  static const bool cache_allowed =
      cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxCachedLogitBytes)) ==
      cudaSuccess;
  (void)cudaGetLastError();  // a refusal leaves no sticky error: the kernel then reads L2
  const bool cache = cache_allowed && cached_logit_bytes(V) <= kMaxCachedLogitBytes;
  sample_kernel<<<1, kSampleThreads, cache ? cached_logit_bytes(V) : 0, stream>>>(
      result, logits, V, mode_for(options, V), options.temperature, options.top_k, options.top_p, uniform, cache,
      timeline);
  CUDA_CHECK_LAUNCH();
}

int32_t checked_token(const SampleResult& r) {
  if (r.status == int32_t(GpuSampleStatus::kBadLogit)) {
    throw std::invalid_argument("sampler: logit " + std::to_string(r.bad_index) + " is " +
                                (r.bad_is_nan ? "NaN" : "+inf") + " (broken forward pass?)");
  }
  if (r.status == int32_t(GpuSampleStatus::kAllInfinite)) {
    throw std::invalid_argument("sampler: every logit is -inf");
  }
  if (sample_needs_host(r)) {
    throw std::logic_error("gpu_sample: the nucleus holds more than " + std::to_string(kGpuSamplerMaxTopK) +
                           " tokens; the caller samples on the host (sample_needs_host)");
  }
  if (r.status != int32_t(GpuSampleStatus::kOk) || r.token < 0) {
    throw std::runtime_error("gpu_sample: no token (status " + std::to_string(r.status) + ")");
  }
  return r.token;
}

}  // namespace bielik
