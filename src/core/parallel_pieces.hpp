// Internal: how many threads a loop takes, and a loop over [0, n) split into one contiguous piece
// per thread, for work that is one pass over memory (optimizer updates, reductions, fills and
// copies, activations).
#pragma once

#include <pipeline/core/threads.hpp>

#include <algorithm>
#include <cstdint>

namespace pipeline::detail {

// How many of num_threads() threads a loop over `work` elements takes: one per `min_per_thread`
// (at least one). A loop that took every thread once its work passed a threshold gave each of 16
// threads a few thousand elements, whose wake-up then cost more than they saved.
inline int threads_for(std::int64_t work, std::int64_t min_per_thread) {
  return static_cast<int>(
      std::clamp<std::int64_t>(work / min_per_thread, 1, static_cast<std::int64_t>(num_threads())));
}

// Runs fn(begin, count) over [0, n) in one contiguous piece per thread, on as many threads as
// give every piece at least min_piece (at most num_threads()): below that, waking the threads
// costs more than the work. Every piece but the last is a multiple of `align` long, so pieces
// start alike relative to the data (vector loads, cache lines).
template <typename Fn>
void for_each_piece(std::int64_t n, std::int64_t min_piece, std::int64_t align, Fn&& fn) {
  const int threads = threads_for(n, min_piece);
  if (threads <= 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  const std::int64_t piece = ((n + threads - 1) / threads + align - 1) / align * align;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::int64_t begin = std::min<std::int64_t>(n, t * piece);
    const std::int64_t end = std::min<std::int64_t>(n, begin + piece);
    if (end > begin) fn(begin, end - begin);
  }
}

}  // namespace pipeline::detail
