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

}  // namespace pipeline::ops::detail
