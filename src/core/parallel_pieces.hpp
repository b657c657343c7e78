// Internal: a loop over [0, n) split into one contiguous piece per thread, for work that is one
// pass over memory (optimizer updates, reductions, fills and copies).
#pragma once

#include <pipeline/core/threads.hpp>

#include <algorithm>
#include <cstdint>

namespace pipeline::detail {

// Runs fn(begin, count) over [0, n) in one contiguous piece per thread, on as many threads as
// give every piece at least min_piece (at most num_threads()): below that, waking the threads
// costs more than the work. Every piece but the last is a multiple of `align` long, so pieces
// start alike relative to the data (vector loads, cache lines).
template <typename Fn>
void for_each_piece(std::int64_t n, std::int64_t min_piece, std::int64_t align, Fn&& fn) {
  const int threads = static_cast<int>(
      std::clamp<std::int64_t>(n / min_piece, 1, static_cast<std::int64_t>(num_threads())));
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
