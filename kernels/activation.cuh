// Launchers of the element-wise activation kernels (activation.cu). CPU reference and contract:
// include/pipeline/ops/activation.hpp — ReLU and GELU are differentiated from the forward input,
// tanh and sigmoid from the forward output.
//
// All pointers are float32 device memory of `n` elements on the stream's device; y may be x and
// dx may be dy (in place). Asynchronous on `stream`; n == 0 launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// Mirrors ops::Activation (the kernels do not include the op headers).
enum class ActivationKind { ReLU, GELU, Tanh, Sigmoid };

// y = f(x).
void activation_forward(cudaStream_t stream, ActivationKind kind, const float* x, float* y,
                        std::int64_t n);
// y = f(x) rounded to bf16 as it is stored (the bits of float_to_bf16 of the float32 result).
void activation_forward_bf16(cudaStream_t stream, ActivationKind kind, const float* x,
                             std::uint16_t* y, std::int64_t n);
// dx = dy ⊙ f'(saved), `saved` being x for ReLU/GELU and y for tanh/sigmoid.
void activation_backward(cudaStream_t stream, ActivationKind kind, const float* saved,
                         const float* dy, float* dx, std::int64_t n);

}  // namespace pipeline::kernels
