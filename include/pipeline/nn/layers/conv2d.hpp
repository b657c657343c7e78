// Conv2d: 2-D convolution over NCHW input, PyTorch layout and defaults.
//
// Parameters: weight [out, in, kh, kw], bias [out] (optional), both initialised U(±1/√(in·kh·kw))
// like PyTorch's defaults. Input [N, in, H, W] -> output [N, out, OH, OW] with
// OH = (H + 2·pad_h − kh) / stride_h + 1 (and the same in w); dilation 1, groups 1.
// Keeps its input for the weight gradient as the products read it: under a bf16 compute dtype in
// bf16 (ops::saved_product_operand: half the bytes, the same gradients bit for bit, and no second
// conversion for the backward). What a convolution reads in the zoo's models — a ReLU's or a
// pool's output, a residual block's input — nothing else keeps, so the float32 input is freed.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/conv.hpp>
#include <pipeline/ops/precision.hpp>

#include <cmath>

namespace pipeline {

struct Conv2dOptions {
  std::int64_t in_channels = 0, out_channels = 0;
  std::int64_t kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  bool bias = true;
};

class Conv2d final : public Layer {
 public:
  Conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
         std::int64_t stride = 1, std::int64_t padding = 0, bool bias = true)
      : Conv2d(std::move(name), Conv2dOptions{in_channels, out_channels, kernel, kernel, stride,
                                              stride, padding, padding, bias}) {}

  Conv2d(std::string name, const Conv2dOptions& o)
      : Layer(std::move(name)), m_opt(o), m_window{o.kernel_h, o.kernel_w, o.stride_h,
                                                   o.stride_w, o.pad_h,    o.pad_w} {
    PIPELINE_CHECK_AS(ConfigError, o.in_channels > 0 && o.out_channels > 0,
                      "Conv2d '{}': channels must be positive, got {} -> {}", this->name(),
                      o.in_channels, o.out_channels);
    PIPELINE_CHECK_AS(ConfigError,
                      o.kernel_h > 0 && o.kernel_w > 0 && o.stride_h > 0 && o.stride_w > 0 &&
                          o.pad_h >= 0 && o.pad_w >= 0,
                      "Conv2d '{}': kernel {}x{} and stride {}x{} must be positive and padding "
                      "{}x{} non-negative",
                      this->name(), o.kernel_h, o.kernel_w, o.stride_h, o.stride_w, o.pad_h,
                      o.pad_w);
  }

  std::string kind() const override { return "Conv2d"; }
  const Conv2dOptions& options() const { return m_opt; }
  const ops::Window2d& window() const { return m_window; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() == 4 && in[1] == m_opt.in_channels,
                      "Conv2d '{}' expects [N, {}, H, W] input, got {}", name(), m_opt.in_channels,
                      in);
    return ops::conv2d_output_shape(in, weight_shape(), m_window);
  }
  double flops(const Shape& in) const override {
    const Shape out = output_shape(in);
    return 2.0 * static_cast<double>(out.numel()) * static_cast<double>(m_opt.in_channels) *
           static_cast<double>(m_opt.kernel_h * m_opt.kernel_w);
  }
  std::vector<ParamSpec> parameters() const override {
    // PyTorch: kaiming_uniform(a = √5) for the weight and U(±1/√fan_in) for the bias, both a
    // bound of 1/√fan_in with fan_in = in·kh·kw.
    const float bound = 1.f / std::sqrt(static_cast<float>(fan_in()));
    std::vector<ParamSpec> p{
        {"weight", weight_shape(), Init::uniform(bound), DType::Float32, /*product_operand=*/true}};
    if (m_opt.bias) p.push_back({"bias", {m_opt.out_channels}, Init::uniform(bound)});
    return p;
  }

 protected:
  Tensor forward_impl(LayerParams& p, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    Tensor y = Tensor::empty(output_shape(x.shape()), DType::Float32, x.device());
    const Tensor xp = ops::saved_product_operand(x);  // converted once, for both passes
    ops::conv2d_forward(xp, p.params[0], m_opt.bias ? p.params[1] : Tensor(), y, m_window);
    saved.tensors = {xp};
    return y;
  }

  Tensor backward_impl(const LayerParams& p, const Saved& saved, const Tensor& dy,
                       std::span<Tensor> grads, GradParts parts) const override {
    const Tensor& x = saved.tensors.at(0);
    PIPELINE_CHECK(dy.shape() == output_shape(x.shape()),
                   "Conv2d '{}': output gradient {} does not match the output {} of input {}",
                   name(), dy.shape(), output_shape(x.shape()), x.shape());
    // dy as both products read it (bf16 under a bf16 compute dtype), converted once when both
    // run; the bias gradient sums dy as it is.
    const Tensor dyp = parts == GradParts::Both ? ops::saved_product_operand(dy) : dy;
    if (has_part(parts, GradParts::Weight)) {
      ops::conv2d_backward_filter(x, dyp, grads[0], m_window);
      if (m_opt.bias) ops::conv2d_backward_bias(dy, grads[1]);
    }
    if (!has_part(parts, GradParts::Input)) return {};
    Tensor dx = Tensor::empty(x.shape(), DType::Float32, x.device());
    ops::conv2d_backward_data(dyp, p.params[0], dx, m_window);
    return dx;
  }

 private:
  Shape weight_shape() const {
    return {m_opt.out_channels, m_opt.in_channels, m_opt.kernel_h, m_opt.kernel_w};
  }
  std::int64_t fan_in() const { return m_opt.in_channels * m_opt.kernel_h * m_opt.kernel_w; }

  Conv2dOptions m_opt;
  ops::Window2d m_window;
};

}  // namespace pipeline
