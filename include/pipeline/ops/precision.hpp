// Mixed precision: the dtype in which the products — matrix products (gemm), convolutions and
// attention — read their operands.
//
// float32 (the default) computes everything in fp32. bfloat16 is mixed precision in the sense of
// torch.autocast(dtype=torch.bfloat16) for these ops: every operand is rounded to bf16 (nearest,
// ties to even: ops/convert.hpp) and the products accumulate in fp32; matrix products and
// attention return fp32 results, convolutions their results rounded to bf16 (what cuDNN's bf16
// convolutions write; ops/conv.hpp). Everything else — biases, activations, norms, softmax,
// losses, reductions, optimizer state and the master weights — stays fp32. On CUDA, matrix
// products (cuBLASLt) and convolutions (cuDNN) run on the bf16 tensor cores; attention rounds its
// operands and runs its fp32 kernels, which computes the same thing. The CPU rounds its operands
// and runs its fp32 kernels: the same numbers up to the order of accumulation, which makes it the
// GPU's oracle and lets bf16 training be tested on any machine (it is not faster there).
//
// The setting is per thread (each stage thread of an in-process pipeline has its own), set for a
// scope by ComputeDTypeScope. In either setting a product also takes bfloat16 tensors as
// operands, widened exactly: weight versions stashed in bf16 (WeightStore) are read as they are.
// Because a bf16 compute rounds every weight matrix it reads, stashing those matrices in bf16
// changes no result.
#pragma once

#include <pipeline/core/tensor.hpp>

namespace pipeline::ops {

// The calling thread's product dtype: DType::Float32 or DType::BFloat16.
DType compute_dtype();

// ConfigError unless `dtype` is one the products compute in (float32 or bfloat16).
void check_compute_dtype(DType dtype);

// Sets the calling thread's product dtype until the scope ends (scopes nest).
class ComputeDTypeScope {
 public:
  explicit ComputeDTypeScope(DType dtype);
  ~ComputeDTypeScope();
  ComputeDTypeScope(const ComputeDTypeScope&) = delete;
  ComputeDTypeScope& operator=(const ComputeDTypeScope&) = delete;

 private:
  DType m_previous;
};

// "float32" or "bf16" (the trainers' and the profiler's --dtype) as a DType; a ConfigError naming
// the choices otherwise.
DType parse_compute_dtype(const std::string& name);

// x (float32) rounded to bfloat16 and widened back: a new float32 tensor on x's device, or into
// `out` (x's shape and device; may be x itself).
Tensor round_to_bf16(const Tensor& x);
void round_to_bf16(const Tensor& x, Tensor& out);

// What a product reads for operand x: x widened to float32 when it is bfloat16; under a bf16
// compute dtype, x rounded to bf16 (round_to_bf16); otherwise x itself (shared, not copied).
Tensor product_operand(const Tensor& x);

// What to keep of x for a backward that reads it only as a product operand: under a bf16 compute
// dtype x as a bfloat16 tensor (half the bytes; the product reads the same values), otherwise x
// itself (shared, not copied). Also how to hand one operand to several products: converted once.
Tensor saved_product_operand(const Tensor& x);

// What a layer writes its output as. ProductOperand: under a bf16 compute dtype in bf16, the
// values a product reading it would round it to, for an output that only products read (inside
// a transformer block the layer norms feeding qkv and fc1, GELU feeding fc2): the product's
// conversion pass and half the output's bytes are saved, and every result is the same bits.
// Float32 (the default): always float32. PIPELINE_BF16_OUTPUTS=0 makes every output float32
// (the same results; for comparing the two data flows).
enum class OutputAs { Float32, ProductOperand };

// The dtype of an output written `as`, under the calling thread's compute dtype.
DType output_dtype(OutputAs as);

// Whether ProductOperand outputs are written in the compute dtype (PIPELINE_BF16_OUTPUTS unset or
// not 0; read once per process).
bool bf16_outputs_for_products();

}  // namespace pipeline::ops
