#include "short_product.hpp"

#include "../core/parallel.hpp"
#include "register_tile.hpp"
#include "scratch.hpp"
#include "split_product.hpp"
#include "vector_lanes.hpp"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pipeline::ops::detail {

#if defined(__AVX512F__)

namespace {

// Below this many elements (4 MiB) the long operand stays in the caches, where Eigen's packed
// panels cost little and its kernel wins (the mlp's 256 x 784 weight ran 10-40% slower here).
constexpr std::int64_t kMinLong = std::int64_t{1} << 20;

// A's rows in tiles of R, each tile transposed: at[(t · k + p) · R + r] = a[(t · R + r) · lda +
// p], zero for the rows past m; from the caching host allocator, filled on the product's threads.
Scratch packed_tiles(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k,
                     std::int64_t R) {
  const std::int64_t tiles = (m + R - 1) / R;
  Scratch at(tiles * k * R);
  float* out = at.get();
  pipeline::detail::parallel_for(
      tiles * k, pipeline::detail::threads_for(tiles * k * R, std::int64_t{1} << 15),
      [&](std::int64_t q) {
        const std::int64_t t = q / k, p = q % k;
        for (std::int64_t r = 0; r < R; ++r) {
          const std::int64_t i = t * R + r;
          out[q * R + r] = i < m ? a[i * lda + p] : 0.f;
        }
      });
  return at;
}

// R columns of C over its 16 V rows, written column by column into ct (ct[r · 16 V + i] = Σ_p
// at[p][i] · b[r][p], b's rows ldb floats apart): C's own columns lie a row of C apart, often 4
// KiB, where storing them element by element took a sixth of the kernel's time.
template <int V, int R>
void tile(const float* at, std::int64_t k, const float* b, std::int64_t ldb, float* ct) {
  constexpr int kRows = 16 * V;
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    __m512 x[V];
    for (int v = 0; v < V; ++v) x[v] = _mm512_loadu_ps(at + p * kRows + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(b[r * ldb + p]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(x[v], s, acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(ct + r * kRows + 16 * v, acc[r][v]);
}

// About 24 accumulators in every shape: V vectors of rows times R columns.
template <int V>
constexpr int kTileColumns = V == 4   ? 6
                             : V == 3 ? 8
                                      : 12;

// How many threads a product of m x n x k multiply-adds takes (one inside a parallel region).
int product_threads(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t items) {
  if (in_parallel_region()) return 1;
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return static_cast<int>(std::clamp<std::int64_t>(
      std::min(static_cast<std::int64_t>(work / static_cast<double>(kMinProductWork)), items), 1,
      num_threads()));
}

template <int V>
void abt(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
         std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
         std::int64_t ldc) {
  constexpr int kRows = 16 * V;
  Scratch at = packed_tiles(a, lda, m, k, kRows);  // one tile of all the rows
  Scratch ct(n * kRows);                           // C transposed, each column's kRows together
  // Whole tiles of R columns per thread, then the last columns one by one; each thread then
  // writes its columns of C row by row.
  constexpr int R = kTileColumns<V>;
  const std::int64_t tiles = (n + R - 1) / R;
  const int threads = product_threads(m, n, k, tiles);
  pipeline::detail::on_threads(threads, [&](int t) {
    const auto range = pipeline::detail::static_range(tiles, threads, t);
    const std::int64_t begin = range.begin * R, end = std::min(n, range.end * R);
    std::int64_t j = begin;
    for (; j + R <= end; j += R) tile<V, R>(at.get(), k, b + j * ldb, ldb, ct.get() + j * kRows);
    for (; j < end; ++j) tile<V, 1>(at.get(), k, b + j * ldb, ldb, ct.get() + j * kRows);
    for (std::int64_t i = 0; i < m; ++i) {
      float* out = c + i * ldc;
      const float* column = ct.get() + i;
      if (beta == 0.f) {
        for (j = begin; j < end; ++j) out[j] = alpha * column[j * kRows];
      } else {
        for (j = begin; j < end; ++j) out[j] = alpha * column[j * kRows] + beta * out[j];
      }
    }
  });
}

// Rows [i0, i1) of C = alpha · Aᵀ · B + beta · C, R rows at a time and the rest one by one, each
// over all columns, 64 at a time (the last chunk under a mask).
template <int R>
void depth_rows(std::int64_t i0, std::int64_t i1, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, float alpha, float beta,
                float* c, std::int64_t ldc) {
  // The tile's columns of A, packed [p][r]: A's rows are lda floats apart (a weight's width,
  // often a multiple of 4 KiB, which puts every row's line in one L1 set).
  float packed[kShortRows * R];
  const auto run = [&]<int Rows>(std::int64_t i) {
    for (std::int64_t p = 0; p < k; ++p)
      for (int r = 0; r < Rows; ++r) packed[p * Rows + r] = a[p * lda + i + r];
    std::int64_t j = 0;
    for (; j + 64 <= n; j += 64)
      depth_tile<Rows, 4>(k, packed, Rows, b + j, ldb, alpha, beta, c + i * ldc + j, ldc, 0xffff);
    for (; j < n; j += 16) {
      depth_tile<Rows, 1>(k, packed, Rows, b + j, ldb, alpha, beta, c + i * ldc + j, ldc,
                          first_lanes(n - j));
    }
  };
  std::int64_t i = i0;
  for (; i + R <= i1; i += R) run.template operator()<R>(i);
  for (; i < i1; ++i) run.template operator()<1>(i);
}

// How far ahead the first tile of a strip in ab() prefetches B's rows.
constexpr int kPrefetchRows = 32;

// C = alpha · A · B + beta · C for a short A (m ≤ kShortRows rows) and a long depth: A's rows
// packed transposed, R at a time ([tile][p][r]); then each thread takes strips of 16 KV of C's
// columns and runs every row tile down the strip, so that the strip of B (k rows of 64 KV bytes)
// comes from memory once and from L2 for the other tiles.
template <int R, int KV>
void ab(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
        std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
        std::int64_t ldc) {
  const std::int64_t tiles = (m + R - 1) / R;
  Scratch packed = packed_tiles(a, lda, m, k, R);
  const float* at = packed.get();
  constexpr std::int64_t kStrip = 16 * KV;
  const std::int64_t strips = (n + kStrip - 1) / kStrip;
  const int threads = product_threads(m, n, k, strips);
  pipeline::detail::on_threads(threads, [&](int thread) {
    const auto range = pipeline::detail::static_range(strips, threads, thread);
    alignas(64) float rows[R * kStrip];  // a tile's last rows, past m, land here
    for (std::int64_t strip = range.begin; strip < range.end; ++strip) {
      const std::int64_t j = strip * kStrip, width = std::min(kStrip, n - j);
      for (std::int64_t t = 0; t < tiles; ++t) {
        const std::int64_t i0 = t * R, valid = std::min<std::int64_t>(R, m - i0);
        // A partial tile writes into `rows` (beta 0), then its valid rows are combined.
        float* out = valid == R ? c + i0 * ldc + j : rows;
        const std::int64_t ld = valid == R ? ldc : kStrip;
        const float tile_beta = valid == R ? beta : 0.f;
        const float* ap = at + t * k * R;
        // The first tile of a strip reads the strip's rows of B from memory, each row ldb floats
        // from the last (12.5 KiB in fc1's weight, farther than the hardware prefetchers look):
        // it prefetches them kPrefetchRows ahead (fashion-cnn's fc1 input gradient 1.85 → 1.67
        // ms on 2 threads); the later tiles find them in L2.
        if (width == kStrip && t == 0) {
          depth_tile<R, KV, kPrefetchRows>(k, ap, R, b + j, ldb, alpha, tile_beta, out, ld, 0xffff);
        } else if (width == kStrip) {
          depth_tile<R, KV>(k, ap, R, b + j, ldb, alpha, tile_beta, out, ld, 0xffff);
        } else {
          for (std::int64_t v = 0; v < width; v += 16) {
            depth_tile<R, 1>(k, ap, R, b + j + v, ldb, alpha, tile_beta, out + v, ld,
                             first_lanes(width - v));
          }
        }
        if (valid < R)
          for (std::int64_t r = 0; r < valid; ++r)
            for (std::int64_t col = 0; col < width; ++col) {
              float& dst = c[(i0 + r) * ldc + j + col];
              dst = rows[r * kStrip + col] + (beta == 0.f ? 0.f : beta * dst);
            }
      }
    }
  });
}

}  // namespace

bool short_product_kernel() {
  // PIPELINE_SHORT_PRODUCTS=0 leaves every product to Eigen (for A/B measurements).
  static const bool on = [] {
    const char* v = std::getenv("PIPELINE_SHORT_PRODUCTS");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return on;
}

bool short_product(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                   float beta, float* c, std::int64_t ldc) {
  if (!short_product_kernel() || (trans_a && trans_b)) return false;
  // The batch: A's rows (x · Wᵀ, dy · W) or the depth (dyᵀ · x); the weight: B, or C.
  const std::int64_t batch = trans_a ? k : m, weight = trans_a ? m * n : n * k;
  if (batch < 1 || batch > kShortRows || weight < kMinLong) return false;
  if (trans_a) {
    // Tiles of 6 rows of C per thread (C's rows are the weight's: each thread writes its own).
    constexpr int R = 6;
    const std::int64_t tiles = (m + R - 1) / R;
    const int threads = product_threads(m, n, k, tiles);
    pipeline::detail::on_threads(threads, [&](int t) {
      const auto range = pipeline::detail::static_range(tiles, threads, t);
      depth_rows<R>(range.begin * R, std::min(m, range.end * R), n, k, a, lda, b, ldb, alpha, beta,
                    c, ldc);
    });
  } else if (!trans_b) {
    ab<8, 3>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    switch ((m + 15) / 16) {
      case 1:
        abt<1>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        break;
      case 2:
        abt<2>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        break;
      case 3:
        abt<3>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        break;
      default:
        abt<4>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        break;
    }
  }
  return true;
}

#else  // no AVX-512: Eigen multiplies everything

bool short_product_kernel() {
  return false;
}
bool short_product(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                   std::int64_t, const float*, std::int64_t, float, float*, std::int64_t) {
  return false;
}

#endif

}  // namespace pipeline::ops::detail
