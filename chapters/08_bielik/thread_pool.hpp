/// @file thread_pool.hpp
/// @brief A tiny fork-join pool for the CPU backend: split a loop over rows among threads.
///
/// A decode step runs ~7 matmuls per layer, each a few hundred microseconds on a CPU,
/// so starting fresh std::threads for each one would be visible; the pool keeps its
/// workers parked on a condition variable between calls instead.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bielik {

class ThreadPool {
 public:
  /// `threads` workers in total, the calling thread included (1: everything inline).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Calls body(begin, end) on disjoint contiguous ranges covering [0, n), one range
  /// per thread, and returns when all are done. The ranges are fixed by n and the
  /// thread count, so results never depend on scheduling.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& body);

  int threads() const { return int(workers_.size()) + 1; }

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;  // the job of this round
  int64_t n_ = 0;
  uint64_t round_ = 0;  // bumped per parallel_for: wakes every worker exactly once
  int pending_ = 0;     // workers still busy in this round
  bool stopping_ = false;
};

}  // namespace bielik
