// Internal: how the ops run loops on threads.
//
// Every parallel region takes the whole OpenMP team, num_threads() threads, even when its work
// wants fewer: the work goes to the first `threads` of them and the rest pass straight to the
// closing barrier. libgomp ends the surplus threads of its pool whenever a region asks for fewer
// threads than the one before, and creates them anew for the next larger one; with regions sized
// to their work, a training step on 16 threads created 16-33 threads (bench/RESULTS.md).
#pragma once

#include <pipeline/core/even_split.hpp>
#include <pipeline/core/threads.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pipeline::detail {

// How many of num_threads() threads a loop over `work` elements takes: one per `min_per_thread`
// (at least one). A loop that took every thread once its work passed a threshold gave each of 16
// threads a few thousand elements, whose wake-up then cost more than they saved.
inline int threads_for(std::int64_t work, std::int64_t min_per_thread) {
  return static_cast<int>(
      std::clamp<std::int64_t>(work / min_per_thread, 1, static_cast<std::int64_t>(num_threads())));
}

// Calls fn(t) once for every t in [0, threads), on the team (one t a thread, or several where
// the team is smaller: inside another parallel region it is the calling thread alone). With one
// thread, fn(0) runs on the caller and no region opens. fn must not throw.
template <typename Fn>
void on_threads(int threads, Fn&& fn) {
  if (threads <= 1) {
    fn(0);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(std::max(1, num_threads())) if (!omp_in_parallel())
  for (int t = omp_get_thread_num(); t < threads; t += omp_get_num_threads()) fn(t);
#else
  for (int t = 0; t < threads; ++t) fn(t);
#endif
}

// Thread t's part of [0, n) split over `threads` threads (OpenMP's static schedule), so a thread
// count fixes who computes what.
using Range = IndexRange;
inline Range static_range(std::int64_t n, int threads, int t) {
  return even_part(n, threads, t);
}

// `threads`, but at least one and no more than there are items.
inline int threads_over(std::int64_t n, int threads) {
  return static_cast<int>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(n, 1)));
}

// fn(i) for every i in [0, n), each thread over its static_range.
template <typename Fn>
void parallel_for(std::int64_t n, int threads, Fn&& fn) {
  threads = threads_over(n, threads);
  on_threads(threads, [&](int t) {
    const Range range = static_range(n, threads, t);
    for (std::int64_t i = range.begin; i < range.end; ++i) fn(i);
  });
}

// fn(i, t) for every i in [0, n), handed out one at a time to whichever of the `threads` threads
// is free (t: its index, for per-thread scratch), so that a thread the OS preempts does not hold
// the others at the barrier. Only for work whose results do not depend on who computes it.
template <typename Fn>
void parallel_for_dynamic(std::int64_t n, int threads, Fn&& fn) {
  threads = threads_over(n, threads);
  std::atomic<std::int64_t> next{0};
  on_threads(threads, [&](int t) {
    for (std::int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed))
      fn(i, t);
  });
}

// Each of `threads` pieces of [0, n): an equal share rounded up to a multiple of `align`.
inline std::int64_t piece_length(std::int64_t n, int threads, std::int64_t align) {
  return ((n + threads - 1) / threads + align - 1) / align * align;
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
  const std::int64_t piece = piece_length(n, threads, align);
  on_threads(threads, [&](int t) {
    const std::int64_t begin = std::min<std::int64_t>(n, t * piece);
    const std::int64_t end = std::min<std::int64_t>(n, begin + piece);
    if (end > begin) fn(begin, end - begin);
  });
}

// for_each_piece over several arrays in one region: fn(i, begin, count) for pieces of [0,
// sizes[i]) of every array i, the arrays laid end to end and split into one contiguous piece per
// thread, so that a model's many small tensors share the threads instead of each taking one (or
// one region each). In that layout every array starts at a multiple of `align`, so pieces start
// alike relative to each array's data, as for_each_piece's do.
template <typename Fn>
void for_each_piece_of(std::span<const std::int64_t> sizes, std::int64_t min_piece,
                       std::int64_t align, Fn&& fn) {
  std::vector<std::int64_t> start(sizes.size() + 1, 0);
  for (std::size_t i = 0; i < sizes.size(); ++i)
    start[i + 1] = start[i] + (sizes[i] + align - 1) / align * align;
  const std::int64_t n = start.back();
  const int threads = threads_for(n, min_piece);
  const std::int64_t piece = threads <= 1 ? n : piece_length(n, threads, align);
  on_threads(threads, [&](int t) {
    const std::int64_t begin = std::min<std::int64_t>(n, t * piece);
    const std::int64_t end = std::min<std::int64_t>(n, begin + piece);
    // The first array that ends after `begin`, then every one that starts before `end`.
    auto i = static_cast<std::size_t>(std::upper_bound(start.begin(), start.end(), begin) -
                                      start.begin() - 1);
    for (; i < sizes.size() && start[i] < end; ++i) {
      const std::int64_t from = std::max(begin, start[i]) - start[i];
      const std::int64_t to = std::min(end - start[i], sizes[i]);
      if (to > from) fn(i, from, to - from);
    }
  });
}

}  // namespace pipeline::detail
