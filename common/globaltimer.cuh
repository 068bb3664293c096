/// @file globaltimer.cuh
/// @brief Timelines from inside kernels: %globaltimer (ns, one clock for every SM) and a
/// fold of it into min / max pairs, so that a launch of hundreds of blocks leaves a few
/// numbers: when its first and last blocks reached each point. nsys does not run on the
/// machines this book was measured on and Nsight Compute could not read counters there;
/// these stamps are how chapters 05, 07 and 08 see where a launch spends its time.
#pragma once

#include <cuda_runtime.h>

namespace bielik {

/// The GPU's global timer in ns. Its resolution is ~32 ns on the H200; differences
/// between blocks on different SMs are meaningful (one clock).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

/// Thread 0 of the block folds the time into the min / max pair `event` of `timeline`
/// (values 2 event and 2 event + 1; the min slot must start at ULLONG_MAX, the max slot
/// at 0). A null timeline costs one compare.
__device__ __forceinline__ void timeline_fold(unsigned long long* timeline, int event) {
  if (timeline == nullptr || threadIdx.x != 0) return;
  const unsigned long long now = globaltimer_ns();
  atomicMin(timeline + 2 * event, now);
  atomicMax(timeline + 2 * event + 1, now);
}

/// Always true, but a warp cannot evaluate it before `value` is in its registers: code
/// under the condition runs only once the loads `value` depends on have landed. (Code
/// after a load runs when the load is issued, not when its data is back.) The
/// condition compares with a NaN bit pattern that arithmetic does not produce (a NaN
/// result is always 0x7fffffff). Pass a value computed from the loads (an add, say), not
/// a loaded value itself.
__device__ __forceinline__ bool value_has_arrived(float value) { return __float_as_uint(value) != 0x7fc0beefu; }

/// timeline_fold, stamped only once `value` has arrived in thread 0's registers.
__device__ __forceinline__ void timeline_fold_when_ready(unsigned long long* timeline, int event, float value) {
  if (timeline == nullptr || threadIdx.x != 0) return;
  if (!value_has_arrived(value)) return;
  const unsigned long long now = globaltimer_ns();
  atomicMin(timeline + 2 * event, now);
  atomicMax(timeline + 2 * event + 1, now);
}

}  // namespace bielik
