// Internal: the AVX-512 register tile that the CPU's own product kernels share: R rows by KV
// 16-float vectors of C held in registers while the depth is walked, a row of B loaded as vectors
// and a column of A broadcast element by element (about 24 accumulators is what 32 vector
// registers leave room for).
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace pipeline::ops::detail {

// R rows by 16 KV columns of C: C[r][c] = alpha · Σ_p a[p · lda + r · a_row] · b[p · ldb + c] +
// beta · C[r][c] over the depth p < k, summed in depth order: vectors of b's rows (the last
// under `last`), broadcasts of a's; with kAhead > 0, b's row p + kAhead prefetched into L1 at
// depth p (rows far apart, which the hardware does not prefetch). Always inlined: called out of
// line from one Winograd product loop (after an unrelated change there), each call reloading its
// operands' addresses, the forward convolution ran 1.8x slower.
template <int R, int KV, int kAhead = 0>
[[gnu::always_inline]] inline void depth_tile(std::int64_t k, const float* a, std::int64_t lda,
                                              const float* b, std::int64_t ldb, float alpha,
                                              float beta, float* c, std::int64_t ldc,
                                              __mmask16 last, std::int64_t a_row = 1) {
  __m512 acc[R][KV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < KV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    if constexpr (kAhead > 0) {
      if (p + kAhead < k)
        for (int v = 0; v < KV; ++v)
          _mm_prefetch(reinterpret_cast<const char*>(b + (p + kAhead) * ldb + 16 * v), _MM_HINT_T0);
    }
    __m512 y[KV];
    for (int v = 0; v < KV; ++v)
      y[v] = _mm512_maskz_loadu_ps(v + 1 == KV ? last : __mmask16{0xffff}, b + p * ldb + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(a[p * lda + r * a_row]);
      for (int v = 0; v < KV; ++v) acc[r][v] = _mm512_fmadd_ps(y[v], s, acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < KV; ++v) {
      const __mmask16 mask = v + 1 == KV ? last : __mmask16{0xffff};
      float* out = c + r * ldc + 16 * v;
      __m512 result = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.f) result = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, out), result);
      _mm512_mask_storeu_ps(out, mask, result);
    }
}

}  // namespace pipeline::ops::detail
#endif
