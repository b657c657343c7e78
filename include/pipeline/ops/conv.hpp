// 2-D convolution (cross-correlation, as in PyTorch) on NCHW float32 tensors.
//
// Shapes: x [N, C, H, W], weight [M, C, KH, KW] (PyTorch layout), bias [M] or undefined,
// y [N, M, OH, OW] with OH, OW from Window2d (stride, zero padding, dilation 1).
//   forward:          y  = conv(x, weight) + bias            (y is overwritten)
//   backward_data:    dx = conv_transpose(dy, weight)        (dx is overwritten)
//   backward_filter:  dw += Σ_n dy_n ⋆ x_n                   (accumulates: beta = 1)
//   backward_bias:    db += Σ_{n,oh,ow} dy                   (accumulates)
// Accumulating weight gradients is what makes k microbatches summed into one buffer equal one
// batch of k times the size.
//
// CPU implementation: stride-1 3x3 and 5x5 convolutions with at least 16 input and output
// channels use Winograd's minimal filtering (F(4,3) and F(4,5): 4x and 6.25x fewer multiplies,
// results within rounding of the direct sum, src/ops/conv_winograd.hpp); every other one, or all
// of them under CpuConvAlgorithm::Lowered, im2col per sample + Eigen gemm, samples spread over
// pipeline::num_threads() OpenMP threads (see src/ops/conv.cpp for why). On a CUDA device (every
// tensor on it; mixed devices are a ConfigError naming both): cuDNN with the same accumulate
// semantics, fp32 unless cuda::set_allow_tf32, deterministic algorithms unless
// cuda::set_deterministic(false) (pipeline/cuda/dnn.hpp); the bias add and bias gradient are custom
// kernels. Under a bf16 compute dtype (ops/precision.hpp) the operands (x, weight, dy) are read
// rounded to bf16 and each result — y before its bias, dx, and each call's weight gradient before
// it accumulates — is rounded to bf16, which is what cuDNN's bf16 convolutions (the tensor cores,
// fp32 accumulation) write: on CUDA through cuDNN's graph API on bf16 tensors (cuda/dnn_graph.hpp),
// else as TF32 on the rounded operands; the CPU computes in fp32 and rounds. weight may be a
// bfloat16 tensor (a stashed version).
#pragma once

#include <pipeline/core/tensor.hpp>
#include <pipeline/ops/window2d.hpp>

namespace pipeline::ops {

// Output shape of conv2d for x [N, C, H, W] and weight [M, C, KH, KW]; checks that they agree
// with each other and with the window's kernel extents.
Shape conv2d_output_shape(const Shape& x, const Shape& weight, const Window2d& window);

// How the CPU computes convolutions (process-wide; CUDA devices always use cuDNN). The initial
// value comes from the environment variable PIPELINE_CPU_CONV ("automatic" or "lowered"),
// automatic when it is unset.
enum class CpuConvAlgorithm { Automatic, Lowered };
void set_cpu_conv_algorithm(CpuConvAlgorithm algorithm);
CpuConvAlgorithm cpu_conv_algorithm();

void conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                    const Window2d& window);
void conv2d_backward_data(const Tensor& dy, const Tensor& weight, Tensor& dx,
                          const Window2d& window);
void conv2d_backward_filter(const Tensor& x, const Tensor& dy, Tensor& dweight,
                            const Window2d& window);
void conv2d_backward_bias(const Tensor& dy, Tensor& dbias);

// Allocating form of forward.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& window);

}  // namespace pipeline::ops
