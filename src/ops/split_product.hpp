// Internal: Eigen matrix products on the ops' threads, one block of the result per thread.
//
// Eigen's own parallel product makes its threads wait for each other's packed panels by spinning,
// at every depth block. One descheduled thread (a VM's vCPU, a core another process shares) then
// holds every other one spinning until it runs again: with 8 threads on 2 cores the mlp's step
// spent 97% of its time in those waits, 75x slower than on 2 threads, and on the GPU machine's
// 16-core Xeon the mlp trained at 51k samples/s on one core and 17k on sixteen
// (bench/RESULTS.md). So Eigen never forks here: each thread computes its own block of C — rows,
// or columns where C is wider than tall, in multiples of 16 floats — as a one-thread product, and
// the threads meet once, at the end. A product takes at most one thread per kMinProductWork
// multiply-adds (enough to amortise a fork and join) and one block inside a parallel region (a
// convolution's samples, attention's heads, already on threads). Each element is computed by one
// thread in an order that depends only on the shape and num_threads(), so results are
// deterministic for a given thread count.
#pragma once

#include "../core/parallel.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pipeline::ops::detail {

// About 25 µs of one AVX-512 core's fp32 products.
constexpr std::int64_t kMinProductWork = std::int64_t{1} << 20;

// For its lifetime the calling thread's Eigen products stay on it: Eigen reads the calling
// thread's OpenMP thread count, which this sets to 1 and then restores.
class EigenOnThisThread {
 public:
  EigenOnThisThread() {
#ifdef _OPENMP
    m_previous = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
  }
  ~EigenOnThisThread() {
#ifdef _OPENMP
    omp_set_num_threads(m_previous);
#endif
  }
  EigenOnThisThread(const EigenOnThisThread&) = delete;
  EigenOnThisThread& operator=(const EigenOnThisThread&) = delete;

 private:
  int m_previous = 1;
};

inline bool in_parallel_region() {
#ifdef _OPENMP
  return omp_in_parallel() != 0;
#else
  return false;
#endif
}

enum class Into { Accumulate, Overwrite };

// C += alpha * A * B (Into::Overwrite: C = alpha * A * B) for Eigen expressions (maps, blocks,
// their transposes). Overwriting, each thread zeroes its own block just before it accumulates
// into it: no serial pass over C on the calling thread, and C's lines start in the caches of the
// threads that write them.
template <typename CMatrix, typename AExpr, typename BExpr>
void split_product(CMatrix&& C, const AExpr& A, const BExpr& B, float alpha,
                   Into into = Into::Accumulate) {
  const std::int64_t m = C.rows(), n = C.cols(), k = A.cols();
  constexpr std::int64_t kAlign = 16;
  const bool by_columns = n >= m;
  const std::int64_t extent = by_columns ? n : m;
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const std::int64_t most = in_parallel_region() ? 1 : static_cast<std::int64_t>(num_threads());
  const auto threads = static_cast<int>(std::clamp<std::int64_t>(
      std::min(static_cast<std::int64_t>(work / static_cast<double>(kMinProductWork)),
               extent / kAlign),
      1, most));
  if (threads <= 1) {
    const EigenOnThisThread one;
    if (into == Into::Overwrite) C.setZero();
    C.noalias() += alpha * (A * B);
    return;
  }
  const std::int64_t piece = (extent / threads + kAlign - 1) / kAlign * kAlign;
  pipeline::detail::on_threads(threads, [&](int t) {
    // Inside the parallel region Eigen keeps each product on its calling thread.
    const std::int64_t begin = std::min(extent, t * piece);
    const std::int64_t len = t + 1 == threads ? extent - begin : std::min(piece, extent - begin);
    if (len <= 0) return;
    if (by_columns) {
      auto block = C.middleCols(begin, len);
      if (into == Into::Overwrite) block.setZero();
      block.noalias() += alpha * (A * B.middleCols(begin, len));
    } else {
      auto block = C.middleRows(begin, len);
      if (into == Into::Overwrite) block.setZero();
      block.noalias() += alpha * (A.middleRows(begin, len) * B);
    }
  });
}

// C = alpha * A * B, as split_product computes it.
template <typename CMatrix, typename AExpr, typename BExpr>
void assign_product(CMatrix&& C, const AExpr& A, const BExpr& B, float alpha = 1.f) {
  split_product(C, A, B, alpha, Into::Overwrite);
}

}  // namespace pipeline::ops::detail
