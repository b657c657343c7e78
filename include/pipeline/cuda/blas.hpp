// Matrix products on the GPU through cuBLASLt: the CUDA side of ops::gemm, and a fused
// bias (+ ReLU) epilogue that saves the separate passes over the output a bias add and an
// activation would make.
//
// Row-major operands, as everywhere in the library: C (m x n) = alpha op(A) op(B) + beta C is
// computed as the column-major product C^T = op(B)^T op(A)^T, which is the same memory. The
// algorithm is chosen by cuBLASLt's heuristic once per shape (and transposes, epilogue, compute
// type) and cached; its workspace (32 MiB per device) comes from the caching allocator.
//
// Precision: fp32 inputs and accumulation by default, so results match the CPU to fp32 rounding;
// gemm_bf16 takes bf16 inputs and accumulates in fp32 (mixed precision, ops/precision.hpp).
// set_allow_tf32(true) lets the tensor cores round inputs to TF32 (10-bit mantissa), several times
// faster and about 1e-3 relative error: an explicit choice, like PyTorch's
// torch.backends.cuda.matmul.allow_tf32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::cuda {

// Makes the calling thread's cuBLASLt handle and workspace on `device` now (otherwise made on
// first use). A CUDA graph capture calls it before it begins: making them is not captured work.
void prepare_blas(int device);

// Whether fp32 matrix products may use TF32 tensor cores (process-wide; default false).
void set_allow_tf32(bool allow);
bool allow_tf32();

enum class GemmEpilogue {
  None,
  Bias,      // C[i][j] += bias[j] (after alpha and beta)
  ReluBias,  // C[i][j] = max(0, C[i][j] + bias[j])
};

// C = alpha op(A) op(B) + beta C (then the epilogue), all row-major fp32 on `device`, queued on
// `stream`. A is m x k after op (stored k x m when trans_a), B is k x n after op; lda/ldb/ldc
// are the row strides (the stored column counts). bias: n floats, for the Bias epilogues.
void gemm_f32(cudaStream_t stream, int device, bool trans_a, bool trans_b, std::int64_t m,
              std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
              const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc,
              GemmEpilogue epilogue = GemmEpilogue::None, const float* bias = nullptr);

// The same with bf16 operands (their 16 bits), accumulated and written in fp32 on the bf16 tensor
// cores: the CUDA side of ops::gemm under a bf16 compute dtype (ops/precision.hpp).
void gemm_bf16(cudaStream_t stream, int device, bool trans_a, bool trans_b, std::int64_t m,
               std::int64_t n, std::int64_t k, float alpha, const std::uint16_t* a,
               std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, GemmEpilogue epilogue = GemmEpilogue::None,
               const float* bias = nullptr);

// C (bf16, its 16 bits; beta 0) = alpha op(A) op(B) (then the epilogue, its bias fp32) with bf16
// operands accumulated in fp32 and rounded once as they are stored: a product whose result only
// other products read (ops::OutputAs). False, with nothing queued, when cuBLASLt has no algorithm
// for it; the caller then computes in fp32 and rounds.
bool gemm_bf16_out(cudaStream_t stream, int device, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, float alpha, const std::uint16_t* a,
                   std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, std::uint16_t* c,
                   std::int64_t ldc, GemmEpilogue epilogue = GemmEpilogue::None,
                   const float* bias = nullptr);

}  // namespace pipeline::cuda
