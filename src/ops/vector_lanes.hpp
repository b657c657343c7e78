// Internal: the mask of a 16-float AVX-512 vector's first `count` lanes (all 16 from 16 on, none
// at 0 or below), for the tails of rows the CPU kernels load and store under masks.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace pipeline::ops::detail {

inline __mmask16 first_lanes(std::int64_t count) {
  if (count >= 16) return 0xffff;
  return count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1u);
}

}  // namespace pipeline::ops::detail
#endif
