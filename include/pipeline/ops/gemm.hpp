// gemm: C = alpha · op(A) · op(B) + beta · C on row-major float matrices.
//
// A, B and C are rank-2 tensors (reshape batched tensors first; reshape is free). op(X) is X or
// its transpose. beta = 1 accumulates into C, which is how gradient accumulation over
// microbatches is expressed. CPU: Eigen's blocked, vectorised, threaded gemm. CUDA (all three on
// one device): cuBLASLt in fp32, or TF32 where cuda::set_allow_tf32 allows it (cuda/blas.hpp).
// Under a bf16 compute dtype (ops/precision.hpp) A and B are read rounded to bf16 (bf16 tensor
// cores on CUDA); C stays float32. A and B may be bfloat16 tensors (stashed weights).
#pragma once

#include <pipeline/core/tensor.hpp>

namespace pipeline::ops {

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          float alpha = 1.f, float beta = 0.f);

// C = op(A) · op(B) + bias: `bias` (float32, one value per column of C) added to every row. On
// CUDA the bias rides the product's epilogue (cuBLASLt), which saves a pass over C; elsewhere it
// is gemm, then add_bias (ops/bias.hpp). The same numbers either way.
void gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
               Tensor& c);

// Allocating form: returns op(A) · op(B).
Tensor matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b);

}  // namespace pipeline::ops
