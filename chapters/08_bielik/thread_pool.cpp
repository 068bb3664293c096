#include "thread_pool.hpp"

#include <algorithm>

namespace bielik {

namespace {
// The slice of [0, n) that part `index` of `parts` owns.
void slice(int64_t n, int parts, int index, int64_t* begin, int64_t* end) {
  int64_t base = n / parts, extra = n % parts;
  *begin = index * base + std::min<int64_t>(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int parts = threads();
  if (parts == 1 || n == 1) {
    body(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    n_ = n;
    pending_ = parts - 1;
    ++round_;
  }
  work_ready_.notify_all();
  int64_t begin, end;
  slice(n, parts, 0, &begin, &end);  // the caller takes part 0
  if (begin < end) body(begin, end);
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen_round = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* body;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || round_ != seen_round; });
      if (stopping_) return;
      seen_round = round_;
      body = body_;
      n = n_;
    }
    int64_t begin, end;
    slice(n, threads(), index, &begin, &end);
    if (begin < end) (*body)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) work_done_.notify_one();
    }
  }
}

}  // namespace bielik
