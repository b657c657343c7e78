// Normalisation ops: layer norm over the last dimension and batch norm over NCHW channels.
//
// Layer norm: x is viewed as [rows, features] (features = weight.numel(), the innermost extent);
// y = (x − mean) · rstd · weight + bias per row, with rstd = 1/√(var + eps) and the biased
// variance, as PyTorch's nn.LayerNorm. The forward writes mean and rstd ([rows] each), which the
// backward takes back.
//
// Batch norm: x is [N, C, H, W] (H and W may be 1); statistics are per channel over N·H·W.
// Training uses the batch statistics and updates the running estimates like PyTorch:
// running = (1 − momentum) · running + momentum · batch, with the *unbiased* variance for
// running_var (the biased one normalises). Evaluation normalises with the running estimates,
// and its backward treats them as constants. Both write mean and rstd ([C]) for the backward.
//
// Backward outputs are optional (nullptr skips them); dweight and dbias are accumulated into
// (+=), dx is overwritten. All tensors are float32 (the layer norm's y may be bfloat16: y rounded
// as it is written, for an output that only products read; ops/precision.hpp: OutputAs), all on the
// CPU or all on one CUDA device (layer norm and batch norm have custom kernels there:
// kernels/layer_norm.cuh, batch_norm.cuh).
#pragma once

#include <pipeline/core/tensor.hpp>

namespace pipeline::ops {

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd);
void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, Tensor* dx, Tensor* dweight,
                         Tensor* dbias);

// Training forward: batch statistics; updates running_mean / running_var in place.
void batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                              float momentum, Tensor& running_mean, Tensor& running_var, Tensor& y,
                              Tensor& mean, Tensor& rstd);
// Evaluation forward: running statistics (mean and rstd are derived from them for backward).
void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                             const Tensor& running_mean, const Tensor& running_var, Tensor& y,
                             Tensor& mean, Tensor& rstd);
// `training` says whether mean/rstd were batch statistics (and so depend on x) or constants.
void batch_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, bool training, Tensor* dx,
                         Tensor* dweight, Tensor* dbias);

}  // namespace pipeline::ops
