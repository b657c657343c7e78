// Internal: how many threads one Eigen matrix product runs on.
//
// Eigen forks a product across every thread once each gets 50,000 multiply-adds (about a
// microsecond of work), and splits the packing of its left operand (for our row-major results:
// the n columns of C) into per-thread panels of mr rows (48 floats with AVX-512), which every
// thread waits for, spinning, at each depth block. With more threads than n / mr, all but the last
// thread get no panel: one thread packs while the others spin, on a VM's cores and hyper-threads
// slowing it down. That is how the mlp's 64 × 784 × 256 products trained at 51k samples/s on one
// core of the GPU machine's Xeon and at 17k on sixteen (bench/RESULTS.md).
//
// So a product of C (m × n) over depth k runs on at most num_threads(), at most n / mr (every
// thread packs a panel) and at most one thread per kMinProductWork multiply-adds (enough work to
// amortise a fork and join). The count depends only on the shape and num_threads(), so results
// stay deterministic for a given thread count.
#pragma once

#include <pipeline/core/threads.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pipeline::ops::detail {

// About 25 µs of one AVX-512 core's fp32 products.
constexpr std::int64_t kMinProductWork = std::int64_t{1} << 20;

inline int product_threads(std::int64_t m, std::int64_t n, std::int64_t k) {
  constexpr std::int64_t mr = Eigen::internal::gebp_traits<float, float>::mr;
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto by_work = static_cast<std::int64_t>(work / static_cast<double>(kMinProductWork));
  return static_cast<int>(std::clamp<std::int64_t>(std::min(by_work, n / mr), 1,
                                                   static_cast<std::int64_t>(num_threads())));
}

// For its lifetime the calling thread's Eigen products run on product_threads(m, n, k) threads.
// Eigen reads the calling thread's OpenMP thread count (set_num_threads leaves Eigen's own
// process-wide setting alone), so ranks that are threads of one process do not disturb each other.
class ProductThreads {
 public:
  ProductThreads(std::int64_t m, std::int64_t n, std::int64_t k) {
#ifdef _OPENMP
    m_previous = omp_get_max_threads();
    omp_set_num_threads(product_threads(m, n, k));
#else
    (void)m, (void)n, (void)k;
#endif
  }
  ~ProductThreads() {
#ifdef _OPENMP
    omp_set_num_threads(m_previous);
#endif
  }
  ProductThreads(const ProductThreads&) = delete;
  ProductThreads& operator=(const ProductThreads&) = delete;

 private:
  int m_previous = 1;
};

// C += alpha * A * B (Eigen expressions: maps, their transposes) on up to num_threads() threads
// without Eigen's own threading. Eigen's parallel product makes its threads wait for each other's
// packed panels by spinning, so one descheduled thread (a VM's vCPU, a core shared with another
// process) holds all the others spinning: with 8 threads on 2 cores the mlp's step spent 97% of
// its time in those waits, 75x slower than on 2 threads. Here each thread computes its own block
// of C — rows, or columns where C is wider than tall, in multiples of 16 — as a one-thread
// product, and the threads meet once, at the end. Each element is computed by one thread in the
// same order for a given thread count, so results are deterministic for it.
template <typename CMatrix, typename AExpr, typename BExpr>
void split_product(CMatrix&& C, const AExpr& A, const BExpr& B, float alpha) {
  const std::int64_t m = C.rows(), n = C.cols(), k = A.cols();
  constexpr std::int64_t kAlign = 16;
  const bool by_columns = n >= m;
  const std::int64_t extent = by_columns ? n : m;
  const std::int64_t blocks = std::max<std::int64_t>(1, extent / kAlign);
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto threads = static_cast<int>(std::clamp<std::int64_t>(
      std::min(static_cast<std::int64_t>(work / static_cast<double>(kMinProductWork)), blocks), 1,
      static_cast<std::int64_t>(num_threads())));
  if (threads <= 1) {
    const ProductThreads one(1, 1, 1);  // Eigen stays on this thread
    C.noalias() += alpha * (A * B);
    return;
  }
  const std::int64_t piece = (extent / threads + kAlign - 1) / kAlign * kAlign;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    // Inside a parallel region Eigen runs each product on its calling thread.
    const std::int64_t begin = std::min(extent, t * piece);
    const std::int64_t len = t + 1 == threads ? extent - begin : std::min(piece, extent - begin);
    if (len <= 0) continue;
    if (by_columns)
      C.middleCols(begin, len).noalias() += alpha * (A * B.middleCols(begin, len));
    else
      C.middleRows(begin, len).noalias() += alpha * (A.middleRows(begin, len) * B);
  }
}

}  // namespace pipeline::ops::detail
