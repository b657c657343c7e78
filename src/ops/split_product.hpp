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
#include <type_traits>

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

// Eigen's packing buffers, kept per thread. Eigen's product allocates its packed panels on every
// call and frees them after; on a worker thread a panel over 128 KiB comes from that thread's
// malloc arena, which glibc shrinks again on free, so every product paid page faults and TLB
// shootdowns for memory it had just released (the mlp's step at 2 threads: ~90 faults, 25% of
// its time; bench/RESULTS.md). Grown as needed, never shrunk, 64-byte aligned as Eigen's.
inline float* packing_buffer(int which, std::int64_t floats) {
  struct Buffer {
    float* data = nullptr;
    std::int64_t floats = 0;
    ~Buffer() { Eigen::internal::aligned_free(data); }
  };
  thread_local Buffer buffers[2];
  Buffer& b = buffers[which];
  if (b.floats < floats) {
    Eigen::internal::aligned_free(b.data);
    b.data = static_cast<float*>(
        Eigen::internal::aligned_malloc(static_cast<std::size_t>(floats) * sizeof(float)));
    b.floats = floats;
  }
  return b.data;
}

// Eigen's blocking of a one-thread float product (the sizes its own product would choose), its
// panels in the calling thread's packing_buffer instead of a fresh allocation.
template <int DestOrder>
class ReusedBlocking
    : public Eigen::internal::gemm_blocking_space<DestOrder, float, float, Eigen::Dynamic,
                                                  Eigen::Dynamic, Eigen::Dynamic, 1, false> {
 public:
  ReusedBlocking(Eigen::Index rows, Eigen::Index cols, Eigen::Index depth)
      : ReusedBlocking::gemm_blocking_space(rows, cols, depth, 1, true) {
    this->m_blockA = packing_buffer(0, this->m_mc * this->m_kc);
    this->m_blockB = packing_buffer(1, this->m_kc * this->m_nc);
  }
  ~ReusedBlocking() { this->m_blockA = this->m_blockB = nullptr; }  // not Eigen's to free
  ReusedBlocking(const ReusedBlocking&) = delete;
  ReusedBlocking& operator=(const ReusedBlocking&) = delete;
};

// dst += alpha · lhs · rhs on the calling thread: Eigen's float product kernel (as
// `dst.noalias() += alpha * (lhs * rhs)` runs it, the same blocking and so the same bits) over
// the thread's reused packing buffers. Shapes Eigen computes without packing (a row or column
// result, or one under its coefficient-based threshold) go to Eigen as they are.
template <typename Dest, typename Lhs, typename Rhs>
void product_add(Dest&& dst, const Lhs& a_lhs, const Rhs& a_rhs, float alpha) {
  namespace ei = Eigen::internal;
  using D = std::remove_reference_t<Dest>;
  if (a_lhs.cols() == 0 || dst.rows() == 0 || dst.cols() == 0) return;
  if (dst.rows() == 1 || dst.cols() == 1 ||
      a_rhs.rows() + dst.rows() + dst.cols() < EIGEN_GEMM_TO_COEFFBASED_THRESHOLD) {
    dst.noalias() += alpha * (a_lhs * a_rhs);
    return;
  }
  using LhsTraits = ei::blas_traits<Lhs>;
  using RhsTraits = ei::blas_traits<Rhs>;
  using LhsClean = typename ei::remove_all<typename LhsTraits::DirectLinearAccessType>::type;
  using RhsClean = typename ei::remove_all<typename RhsTraits::DirectLinearAccessType>::type;
  const auto& lhs = LhsTraits::extract(a_lhs);
  const auto& rhs = RhsTraits::extract(a_rhs);
  constexpr int kDestOrder = (D::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  constexpr int kLhsOrder =
      (LhsClean::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  constexpr int kRhsOrder =
      (RhsClean::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  static_assert(!LhsTraits::NeedToConjugate && !RhsTraits::NeedToConjugate, "real products");
  const float actual_alpha = ei::combine_scalar_factors(alpha, a_lhs, a_rhs);
  ReusedBlocking<kDestOrder> blocking(dst.rows(), dst.cols(), lhs.cols());
  ei::general_matrix_matrix_product<
      Eigen::Index, float, kLhsOrder, false, float, kRhsOrder, false, kDestOrder,
      D::InnerStrideAtCompileTime>::run(dst.rows(), dst.cols(), lhs.cols(), &lhs.coeffRef(0, 0),
                                        lhs.outerStride(), &rhs.coeffRef(0, 0), rhs.outerStride(),
                                        &dst.coeffRef(0, 0), dst.innerStride(), dst.outerStride(),
                                        actual_alpha, blocking, nullptr);
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
    product_add(C, A, B, alpha);
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
      product_add(block, A, B.middleCols(begin, len), alpha);
    } else {
      auto block = C.middleRows(begin, len);
      if (into == Into::Overwrite) block.setZero();
      product_add(block, A.middleRows(begin, len), B, alpha);
    }
  });
}

// C = alpha * A * B, as split_product computes it.
template <typename CMatrix, typename AExpr, typename BExpr>
void assign_product(CMatrix&& C, const AExpr& A, const BExpr& B, float alpha = 1.f) {
  split_product(C, A, B, alpha, Into::Overwrite);
}

}  // namespace pipeline::ops::detail
