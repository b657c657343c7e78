// Internal: the three products of a Linear layer over a short batch (at most kShortRows rows)
// and a long weight, on AVX-512: the forward x · Wᵀ, the input gradient dy · W and the weight
// gradient dyᵀ · x.
//
// Eigen's gemm packs both operands into panels before it multiplies. With 64 rows on the left,
// each element of the long operand (fashion-cnn's fc1 weight: 3136 x 1024, 12.3 MiB) is used for
// only 64 multiply-adds after it has been read, rearranged and written once more, and the forward
// ran at about half of a core's fp32 rate (bench/RESULTS.md). Here the short operand is packed
// instead and the weight is read in its own layout:
// - x · Wᵀ: x transposed, its 64 rows four 16-float vectors per depth index (L2); a register tile
//   holds R columns of C over all the rows and reads R rows of W front to back, straight from
//   memory, one broadcast per element;
// - dy · W: dy's rows packed 8 at a time; a tile holds 8 rows by 48 columns of C and walks the
//   depth, W's 48 columns as vectors; each thread runs every row tile down a strip of 48 columns,
//   so the strip comes from memory once and from L2 after;
// - dyᵀ · x (a depth of at most 64): tiles of 6 rows by 64 columns of C, x's rows as vectors and
//   dy's as broadcasts.
//
// Every element of C is summed over the depth in index order by one thread, whatever the thread
// count: the results do not depend on it.
#pragma once

#include <cstdint>

namespace pipeline::ops::detail {

constexpr std::int64_t kShortRows = 64;

// Whether short_product has its kernels here: an AVX-512 build, PIPELINE_SHORT_PRODUCTS not 0.
bool short_product_kernel();

// C = alpha · op(A) · op(B) + beta · C (gemm's contract, ops/gemm.hpp: row-major, leading
// dimensions lda, ldb, ldc; beta 0: C is not read) for the three shapes above: x · Wᵀ and dy · W
// (A not transposed, at most kShortRows rows) and dyᵀ · x (A transposed, a depth of at most
// kShortRows). False, leaving C alone, where this build or the shape has no kernel (no AVX-512,
// another shape, a weight under 4 MiB, which the caches hold and Eigen multiplies faster): the
// caller multiplies another way.
bool short_product(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                   float beta, float* c, std::int64_t ldc);

}  // namespace pipeline::ops::detail
