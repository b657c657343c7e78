// Convolutions through cuDNN's graph (backend) API: the path of ops::conv2d_* under a bf16
// compute dtype on CUDA, and of float32 convolutions where asked for.
//
// Why a second API: cuDNN's legacy convolution calls (dnn.hpp) on bf16 NCHW tensors chose kernels
// 6x slower than TF32 ones on vgg16 (bench/RESULTS.md), so bf16 convolutions ran there as TF32
// on operands rounded to bf16 — exact, but at TF32's rate and with float32's bytes. The graph API
// offers cuDNN's current engines for the same NCHW problems (those PyTorch's convolutions run),
// at the bf16 tensor-core rate and half the bytes.
//
// Semantics. bf16: the bf16 ones of ops/conv.hpp — bf16 operands, fp32 accumulation, the result
// rounded to bf16 by cuDNN itself into a bf16 tensor, overwritten (the ops accumulate weight
// gradients in float32 themselves). float32: those of dnn.hpp's passes (out = pass + beta · out;
// exact fp32 unless cuda::allow_tf32()).
//
// Engine choice. Per problem (pass, shapes, strides, padding, element type, beta, determinism,
// exactness, pointer alignment) and per thread and device, once: cuDNN's heuristics (mode A, then
// its fallback list) rank the engine configurations; those that reduce in reduced precision, are
// non-deterministic while cuda::deterministic() holds, or (exact float32) round their inputs to
// TF32 or compute in a transformed domain are dropped; up to kGraphCandidates of the rest that
// build an execution plan within the workspace limit are timed on the real operands (CUDA events,
// one warm-up run and three timed; an accumulating output is a scratch copy then) and the fastest
// is kept, like cudnn.benchmark. The search synchronises the stream once per new problem; while
// the stream is being captured into a CUDA graph it takes the best ranked plan untimed. A problem
// for which no engine qualifies, or whose plan fails to run, returns false, queues nothing and
// is remembered (a warning once per problem): the caller then runs the legacy path.
//
// graph_convolutions() says which convolutions take this path (process-wide; the initial value
// comes from the environment variable PIPELINE_CUDNN_GRAPH=none|bf16|all, bf16 when unset):
// None for A/B comparisons with the legacy path; All adds float32 (TF32 or exact).
// Requires the CUDA toolkit and cuDNN 9 (PIPELINE_WITH_CUDA builds only).
#pragma once

#include <pipeline/cuda/dnn.hpp>

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::cuda {

enum class GraphConvolutions { None, Bf16, All };
void set_graph_convolutions(GraphConvolutions which);
GraphConvolutions graph_convolutions();

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

// The float32 passes as dnn.hpp's conv2d_*_f32 (beta 0 or 1), through this API.
bool conv2d_forward_graph_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                              const float* x, const float* weight, float beta, float* y);
bool conv2d_backward_data_graph_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                                    const float* dy, const float* weight, float beta, float* dx);
bool conv2d_backward_filter_graph_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                                      const float* x, const float* dy, float beta, float* dweight);

}  // namespace pipeline::cuda
