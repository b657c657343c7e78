// Internal: the product x · Wᵀ of a short operand (at most kShortRows rows: a training batch)
// and a long one stored by rows (a Linear layer's weight), on AVX-512.
//
// Eigen's gemm packs both operands into panels before it multiplies. With 64 rows on the left,
// each element of the long operand (fashion-cnn's fc1 weight: 3136 x 1024, 12.3 MiB) is used for
// only 64 multiply-adds after it has been read, rearranged and written once more, and the forward
// ran at about half of a core's fp32 rate (bench/RESULTS.md). Here the short operand is packed
// instead: transposed, its 64 rows become four 16-float vectors per depth index, kept in L2; each
// register tile holds R columns of C over all the rows (4 x R accumulators) and reads R rows of W
// front to back, straight from memory, one broadcast per element. (The input gradient dy · W
// reads W by columns; copying them into panels first cost what Eigen's packing costs, and on two
// threads more: it stays with Eigen.)
//
// Every element of C is summed over the depth in index order by one thread, whatever the thread
// count: the results do not depend on it.
#pragma once

#include <cstdint>

namespace pipeline::ops::detail {

constexpr std::int64_t kShortRows = 64;

// Whether short_product_abt has its kernel here: an AVX-512 build, PIPELINE_SHORT_PRODUCTS not 0.
bool short_product_kernel();

// C = alpha · A · Bᵀ + beta · C: A [m x k], B [n x k], C [m x n], row-major with leading
// dimensions lda, ldb, ldc (beta 0: C is not read). False, leaving C alone, where this build or
// the shape has no kernel (no AVX-512, m > kShortRows, a long operand under 4 MiB, which the
// caches hold and Eigen multiplies faster): the caller multiplies another way.
bool short_product_abt(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc);

// C = alpha · Aᵀ · B + beta · C over a short depth: A [k x m], B [k x n], C [m x n] with k ≤
// kShortRows (a weight gradient dW += dyᵀ · x over a batch): tiles of R rows of C by 64 columns in
// registers, B's rows as vectors, A's as broadcasts; each C element written once. False as for
// short_product_abt (C past 4 MiB, or Eigen multiplies).
bool short_product_atb(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc);

}  // namespace pipeline::ops::detail
