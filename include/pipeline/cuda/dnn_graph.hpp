// bf16 convolutions on the tensor cores through cuDNN's graph (backend) API: the path of
// ops::conv2d_* under a bf16 compute dtype on CUDA.
//
// Why a second API: cuDNN's legacy convolution calls (dnn.hpp) on bf16 NCHW tensors chose kernels
// 6x slower than TF32 ones on vgg16 (bench/RESULTS.md), so bf16 convolutions ran there as TF32
// on operands rounded to bf16 — exact, but at TF32's rate and with float32's bytes. The graph API
// offers cuDNN's current engines for the same NCHW bf16 problems (those PyTorch's convolutions
// run), at the bf16 tensor-core rate and half the bytes.
//
// Semantics are the bf16 ones of ops/conv.hpp: bf16 operands, fp32 accumulation, the result
// rounded to bf16 — here by cuDNN itself, into a bf16 tensor. Every call overwrites its output
// (the ops accumulate weight gradients in float32 themselves).
//
// Engine choice. Per problem (pass, shapes, strides, padding, determinism, pointer alignment) and
// per thread and device, once: cuDNN's heuristics (mode A, then its fallback list) rank the
// engine configurations; those that reduce in reduced precision, or are non-deterministic while
// cuda::deterministic() holds, are dropped; up to kGraphCandidates of the rest that build an
// execution plan within the workspace limit are timed on the real operands (CUDA events, one
// warm-up run and three timed) and the fastest is kept, like cudnn.benchmark. The search
// synchronises the stream once per new problem, so it must not happen during CUDA graph
// capture (the trainers run a shape eagerly before they capture it). A problem for which no engine
// qualifies returns false, queues nothing and is remembered (a warning once per problem): the
// caller then runs the legacy path.
//
// bf16_graph_convolutions() switches the path off for A/B comparisons (process-wide; the initial
// value is false only when the environment variable PIPELINE_CUDNN_BF16 is "legacy").
// Requires the CUDA toolkit and cuDNN 9 (PIPELINE_WITH_CUDA builds only).
#pragma once

#include <pipeline/cuda/dnn.hpp>

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::cuda {

void set_bf16_graph_convolutions(bool on);
bool bf16_graph_convolutions();

// bf16 elements are their 16 bits, NCHW, packed. Each returns whether it queued the pass.
// y = x ⋆ weight
bool conv2d_forward_bf16(cudaStream_t stream, int device, const Conv2dProblem& p,
                         const std::uint16_t* x, const std::uint16_t* weight, std::uint16_t* y);
// dx = the adjoint of the forward applied to dy
bool conv2d_backward_data_bf16(cudaStream_t stream, int device, const Conv2dProblem& p,
                               const std::uint16_t* dy, const std::uint16_t* weight,
                               std::uint16_t* dx);
// dweight = Σ_n dy_n ⋆ x_n (overwritten)
bool conv2d_backward_filter_bf16(cudaStream_t stream, int device, const Conv2dProblem& p,
                                 const std::uint16_t* x, const std::uint16_t* dy,
                                 std::uint16_t* dweight);

}  // namespace pipeline::cuda
