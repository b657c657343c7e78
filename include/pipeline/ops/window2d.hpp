// Window2d: the sliding-window geometry shared by 2-D convolution and pooling (kernel, stride and
// zero padding, each possibly different in height and width; dilation 1).
//
// Output extents follow PyTorch (floor mode): out = (in + 2·pad − kernel) / stride + 1. A window
// whose geometry leaves no output, or a non-positive kernel or stride, is rejected with a
// ConfigError naming the offending values.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/core/shape.hpp>

#include <cstdint>

namespace pipeline::ops {

struct Window2d {
  std::int64_t kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;

  static Window2d square(std::int64_t kernel, std::int64_t stride = 1, std::int64_t pad = 0) {
    return {kernel, kernel, stride, stride, pad, pad};
  }

  void validate() const {
    PIPELINE_CHECK_AS(ConfigError, kernel_h > 0 && kernel_w > 0 && stride_h > 0 && stride_w > 0,
                      "window needs positive kernel and stride, got kernel {}x{} stride {}x{}",
                      kernel_h, kernel_w, stride_h, stride_w);
    PIPELINE_CHECK_AS(ConfigError, pad_h >= 0 && pad_w >= 0,
                      "window padding must be non-negative, got {}x{}", pad_h, pad_w);
  }

  std::int64_t out_h(std::int64_t in_h) const {
    return (in_h + 2 * pad_h - kernel_h) / stride_h + 1;
  }
  std::int64_t out_w(std::int64_t in_w) const {
    return (in_w + 2 * pad_w - kernel_w) / stride_w + 1;
  }

  // [N, C, H, W] -> [N, channels, OH, OW]; throws ConfigError when the input is not NCHW or the
  // window does not fit in the padded input.
  Shape output_shape(const Shape& nchw, std::int64_t channels) const {
    validate();
    PIPELINE_CHECK_AS(ConfigError, nchw.rank() == 4, "expected an NCHW input of rank 4, got {}",
                      nchw);
    PIPELINE_CHECK_AS(ConfigError,
                      nchw[2] + 2 * pad_h >= kernel_h && nchw[3] + 2 * pad_w >= kernel_w,
                      "a {}x{} window does not fit in input {} padded by {}x{}", kernel_h, kernel_w,
                      nchw, pad_h, pad_w);
    return Shape{nchw[0], channels, out_h(nchw[2]), out_w(nchw[3])};
  }
};

}  // namespace pipeline::ops
