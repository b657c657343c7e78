// ResidualBlock: the ResNet basic block (He et al., 2016) on NCHW activations.
//
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
//
// conv1 is 3×3 with the block's stride and padding 1, conv2 is 3×3 stride 1 padding 1, both
// without bias (batch norm follows). The shortcut is the identity when the shape is kept
// (stride 1 and in_channels == out_channels), otherwise a 1×1 convolution with the block's
// stride followed by batch norm. Children, named as in torchvision's BasicBlock so parameter
// names match its state dicts: conv1, bn1, relu1, conv2, bn2, [downsample.0, downsample.1], relu2.
// Input [N, in, H, W] -> output [N, out, (H − 1)/stride + 1, (W − 1)/stride + 1].
#pragma once

#include <pipeline/nn/composite.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/batch_norm.hpp>
#include <pipeline/nn/layers/conv2d.hpp>
#include <pipeline/ops/precision.hpp>

namespace pipeline {

class ResidualBlock final : public Composite {
 public:
  ResidualBlock(std::string name, std::int64_t in_channels, std::int64_t out_channels,
                std::int64_t stride = 1)
      : Composite(std::move(name)), m_in(in_channels), m_out(out_channels), m_stride(stride) {
    PIPELINE_CHECK_AS(ConfigError, in_channels > 0 && out_channels > 0 && stride > 0,
                      "ResidualBlock '{}': channels and stride must be positive, got {} -> {}, "
                      "stride {}",
                      this->name(), in_channels, out_channels, stride);
    m_conv1 = add_child<Conv2d>("conv1", in_channels, out_channels, 3, stride, 1, false);
    m_bn1 = add_child<BatchNorm2d>("bn1", out_channels);
    m_relu1 = add_child<ReLU>("relu1");
    m_conv2 = add_child<Conv2d>("conv2", out_channels, out_channels, 3, 1, 1, false);
    m_bn2 = add_child<BatchNorm2d>("bn2", out_channels);
    if (has_downsample()) {
      m_ds_conv = add_child<Conv2d>("downsample.0", in_channels, out_channels, 1, stride, 0, false);
      m_ds_bn = add_child<BatchNorm2d>("downsample.1", out_channels);
    }
    m_relu2 = add_child<ReLU>("relu2");
  }

  std::string kind() const override { return "ResidualBlock"; }
  std::int64_t in_channels() const { return m_in; }
  std::int64_t out_channels() const { return m_out; }
  std::int64_t stride() const { return m_stride; }
  bool has_downsample() const { return m_stride != 1 || m_in != m_out; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() == 4 && in[1] == m_in,
                      "ResidualBlock '{}' expects [N, {}, H, W] input, got {}", name(), m_in, in);
    return child(m_conv1).output_shape(in);
  }
  double flops(const Shape& in) const override {
    const Shape mid = output_shape(in);
    double f = child(m_conv1).flops(in) + child(m_bn1).flops(mid) + child(m_relu1).flops(mid) +
               child(m_conv2).flops(mid) + child(m_bn2).flops(mid) + child(m_relu2).flops(mid);
    if (has_downsample()) f += child(m_ds_conv).flops(in) + child(m_ds_bn).flops(mid);
    return f + static_cast<double>(mid.numel());  // residual add
  }

 protected:
  Tensor forward_impl(LayerParams& p, const Tensor& x, Saved& saved,
                      const ForwardContext& ctx) const override {
    output_shape(x.shape());
    saved.children.assign(static_cast<std::size_t>(num_children()), Saved{});
    // conv1 and the downsampling conv read x as a product operand: converted once, kept once.
    const Tensor xp = ops::saved_product_operand(x);
    Tensor h = forward_child(m_conv1, p, xp, saved, ctx);
    h = forward_child(m_bn1, p, h, saved, ctx);
    h = forward_child(m_relu1, p, h, saved, ctx);
    h = forward_child(m_conv2, p, h, saved, ctx);
    h = forward_child(m_bn2, p, h, saved, ctx);  // a fresh tensor: bn2 keeps its input, not this
    if (has_downsample()) {
      Tensor s = forward_child(m_ds_conv, p, xp, saved, ctx);
      s = forward_child(m_ds_bn, p, s, saved, ctx);
      add_in_place(h, s);
    } else {
      add_in_place(h, x);
    }
    return forward_child(m_relu2, p, h, saved, ctx);
  }

  Tensor composite_backward(const LayerParams& p, const Saved& saved, const Tensor& dy,
                            std::span<Tensor> grads, GradParts parts) const override {
    const GradParts inner = inner_parts(parts), entry = entry_parts(parts);
    Tensor g = backward_child(m_relu2, p, saved, dy, grads, inner);  // d(sum)
    Tensor r = backward_child(m_bn2, p, saved, g, grads, inner);
    r = backward_child(m_conv2, p, saved, r, grads, inner);
    r = backward_child(m_relu1, p, saved, r, grads, inner);
    r = backward_child(m_bn1, p, saved, r, grads, inner);
    Tensor dx = backward_child(m_conv1, p, saved, r, grads, entry);
    if (has_downsample()) {
      // The shortcut's batch norm needs its input gradient only to reach the 1×1 convolution,
      // which in turn needs one only for the block's.
      Tensor s = backward_child(m_ds_bn, p, saved, g, grads, inner);
      s = backward_child(m_ds_conv, p, saved, s, grads, entry);
      if (has_part(parts, GradParts::Input)) add_in_place(dx, s);
    } else if (has_part(parts, GradParts::Input)) {
      add_in_place(dx, g);
    }
    return has_part(parts, GradParts::Input) ? dx : Tensor();
  }

 private:
  std::int64_t m_in, m_out, m_stride;
  int m_conv1 = 0, m_bn1 = 0, m_relu1 = 0, m_conv2 = 0, m_bn2 = 0, m_ds_conv = -1, m_ds_bn = -1,
      m_relu2 = 0;
};

}  // namespace pipeline
