// Internal: what alignment a device pointer promises the libraries (cuDNN, cuBLASLt).
#pragma once

#include <cstdint>

namespace pipeline::cuda::detail {

// The largest power of two, at most `cap`, that divides the address. A tensor view may start
// anywhere its element type allows, so the libraries are told what each pointer holds to rather
// than left to assume their defaults (16 bytes for cuDNN's descriptors, 256 for cuBLASLt).
inline std::int64_t pointer_alignment(const void* p, std::int64_t cap) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::int64_t a = cap;
  while (a > 1 && address % static_cast<std::uintptr_t>(a) != 0) a /= 2;
  return a;
}

}  // namespace pipeline::cuda::detail
