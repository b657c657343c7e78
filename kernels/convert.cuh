// Launchers of the float32 <-> bfloat16 conversions (convert.cu). CPU reference and contract:
// include/pipeline/ops/convert.hpp. bf16 elements are their 16 bits. Asynchronous on `stream`;
// n == 0 launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

void float_to_bf16(cudaStream_t stream, std::uint16_t* out, const float* in, std::int64_t n);
void bf16_to_float(cudaStream_t stream, float* out, const std::uint16_t* in, std::int64_t n);
// out[i] = in[i] rounded to bf16 and widened back (ops::round_to_bf16); out may equal in.
void round_to_bf16(cudaStream_t stream, float* out, const float* in, std::int64_t n);

}  // namespace pipeline::kernels
