// Pooling layers over NCHW input: MaxPool2d, AvgPool2d (PyTorch's count_include_pad=True) and
// GlobalAvgPool ([N, C, H, W] -> [N, C]).
//
// MaxPool2d and AvgPool2d take a square kernel, a stride (0 means "equal to the kernel", PyTorch's
// default) and a padding of at most half the kernel. They have no parameters. MaxPool2d saves the
// argmax positions (int32, the size of its output) rather than its input; the average pools save
// only the input's shape.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/nn/shape_record.hpp>
#include <pipeline/ops/pool.hpp>

namespace pipeline {

namespace detail {

// The pieces MaxPool2d and AvgPool2d share: window validation, shapes and FLOPs.
class Pool2dBase : public Layer {
 public:
  Pool2dBase(std::string name, const char* kind, std::int64_t kernel, std::int64_t stride,
             std::int64_t padding)
      : Layer(std::move(name)),
        m_window(ops::Window2d::square(kernel, stride == 0 ? kernel : stride, padding)) {
    PIPELINE_CHECK_AS(ConfigError,
                      kernel > 0 && stride >= 0 && padding >= 0 && 2 * padding <= kernel,
                      "{} '{}': kernel {} must be positive, stride {} non-negative (0: the kernel) "
                      "and padding {} at most half the kernel",
                      kind, this->name(), kernel, stride, padding);
  }
  const ops::Window2d& window() const { return m_window; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() == 4, "{} '{}' expects [N, C, H, W] input, got {}",
                      kind(), name(), in);
    return ops::pool2d_output_shape(in, m_window);
  }
  // One comparison or addition per window element.
  double flops(const Shape& in) const override {
    return static_cast<double>(output_shape(in).numel()) *
           static_cast<double>(m_window.kernel_h * m_window.kernel_w);
  }

 protected:
  ops::Window2d m_window;
};

}  // namespace detail

class MaxPool2d final : public detail::Pool2dBase {
 public:
  MaxPool2d(std::string name, std::int64_t kernel, std::int64_t stride = 0 /*0: = kernel*/,
            std::int64_t padding = 0)
      : Pool2dBase(std::move(name), "MaxPool2d", kernel, stride, padding) {}
  std::string kind() const override { return "MaxPool2d"; }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    const Shape out = output_shape(x.shape());
    Tensor y = Tensor::empty(out, DType::Float32, x.device());
    Tensor indices = Tensor::empty(out, DType::Int32, x.device());
    ops::max_pool2d_forward(x, y, indices, m_window);
    saved.tensors = {indices, shape_record(x.shape())};
    return y;
  }
  Tensor backward_impl(const LayerParams&, const Saved& saved, const Tensor& dy, std::span<Tensor>,
                       GradParts parts) const override {
    if (!has_part(parts, GradParts::Input)) return {};
    Tensor dx =
        Tensor::empty(shape_from_record(saved.tensors.at(1)), DType::Float32, dy.device());
    ops::max_pool2d_backward(dy, saved.tensors.at(0), dx, m_window);
    return dx;
  }
};

class AvgPool2d final : public detail::Pool2dBase {
 public:
  AvgPool2d(std::string name, std::int64_t kernel, std::int64_t stride = 0 /*0: = kernel*/,
            std::int64_t padding = 0)
      : Pool2dBase(std::move(name), "AvgPool2d", kernel, stride, padding) {}
  std::string kind() const override { return "AvgPool2d"; }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    Tensor y = Tensor::empty(output_shape(x.shape()), DType::Float32, x.device());
    ops::avg_pool2d_forward(x, y, m_window);
    saved.tensors = {shape_record(x.shape())};
    return y;
  }
  Tensor backward_impl(const LayerParams&, const Saved& saved, const Tensor& dy, std::span<Tensor>,
                       GradParts parts) const override {
    if (!has_part(parts, GradParts::Input)) return {};
    Tensor dx =
        Tensor::empty(shape_from_record(saved.tensors.at(0)), DType::Float32, dy.device());
    ops::avg_pool2d_backward(dy, dx, m_window);
    return dx;
  }
};

class GlobalAvgPool final : public Layer {
 public:
  explicit GlobalAvgPool(std::string name) : Layer(std::move(name)) {}
  std::string kind() const override { return "GlobalAvgPool"; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() == 4 && in[2] > 0 && in[3] > 0,
                      "GlobalAvgPool '{}' expects non-empty [N, C, H, W] input, got {}", name(),
                      in);
    return Shape{in[0], in[1]};
  }
  double flops(const Shape& in) const override {
    output_shape(in);
    return static_cast<double>(in.numel());
  }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    Tensor y = Tensor::empty(output_shape(x.shape()), DType::Float32, x.device());
    ops::global_avg_pool_forward(x, y);
    saved.tensors = {shape_record(x.shape())};
    return y;
  }
  Tensor backward_impl(const LayerParams&, const Saved& saved, const Tensor& dy, std::span<Tensor>,
                       GradParts parts) const override {
    if (!has_part(parts, GradParts::Input)) return {};
    Tensor dx =
        Tensor::empty(shape_from_record(saved.tensors.at(0)), DType::Float32, dy.device());
    ops::global_avg_pool_backward(dy, dx);
    return dx;
  }
};

}  // namespace pipeline
