// CUDA activations against the CPU op (the oracle): every activation, forward and backward, over
// odd sizes, in place on a view that is not 16-byte aligned (the scalar path), and the error of a
// call whose tensors are on two devices.
#include <pipeline/ops/activation.hpp>
#include <pipeline/ops/convert.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

#include <string>

namespace test_activation {

using namespace pipeline;
using namespace pipeline::gpu_test;
using ops::Activation;

namespace {
constexpr Activation kAll[] = {Activation::ReLU, Activation::GELU, Activation::Tanh,
                               Activation::Sigmoid};
}

TEST_CASE("activations on CUDA match the CPU, forward and backward") {
  for (std::int64_t n : {0, 1, 7, 33, 1000, 1000003}) {
    for (Activation a : kAll) {
      CAPTURE(n);
      INFO(std::string(ops::activation_name(a)));
      const auto seed = static_cast<std::uint64_t>(n) * 8 + static_cast<std::uint64_t>(a);
      const Tensor x = random_tensor(Shape{n}, seed, -3.f, 3.f);
      const Tensor dy = random_tensor(Shape{n}, seed + 4);
      const Tensor y_cpu = ops::activation_forward(a, x);
      const Tensor saved = ops::activation_saves_output(a) ? y_cpu : x;
      const Tensor dx_cpu = ops::activation_backward(a, saved, dy);

      Tensor y_gpu = poisoned(Shape{n});
      ops::activation_forward(a, x.to(kGpu), y_gpu);
      CHECK(y_gpu.device() == kGpu);
      expect_close("forward", y_cpu, y_gpu, 1e-5);
      // The backward takes the CPU's saved tensor, so both sides differentiate the same values.
      Tensor dx_gpu = poisoned(Shape{n});
      ops::activation_backward(a, saved.to(kGpu), dy.to(kGpu), dx_gpu);
      expect_close("backward", dx_cpu, dx_gpu, 1e-5);
      // The allocating forms allocate on the input's device.
      const Tensor y_alloc = ops::activation_forward(a, x.to(kGpu));
      CHECK(y_alloc.device() == kGpu);
      expect_close("forward (allocating)", y_cpu, y_alloc, 1e-5);
    }
  }
}

TEST_CASE("activations on CUDA: in place on a view at a 4-byte offset") {
  const std::int64_t n = 1001;
  const Tensor x = random_tensor(Shape{n + 1}, 11, -3.f, 3.f);
  const Tensor dy = random_tensor(Shape{n + 1}, 12);
  for (Activation a : kAll) {
    INFO(std::string(ops::activation_name(a)));
    const Tensor y_cpu = ops::activation_forward(a, x.slice(1, n + 1));
    Tensor xg = x.to(kGpu);
    Tensor view = xg.slice(1, n + 1);
    ops::activation_forward(a, view, view);
    expect_close("forward in place", y_cpu, view, 1e-5);
    CHECK(host(xg).values()[0] == x.values()[0]);  // outside the view: untouched

    const Tensor saved = ops::activation_saves_output(a) ? y_cpu : x.slice(1, n + 1);
    const Tensor dx_cpu = ops::activation_backward(a, saved, dy.slice(1, n + 1));
    Tensor dyg = dy.to(kGpu);
    Tensor dview = dyg.slice(1, n + 1);
    ops::activation_backward(a, saved.to(kGpu), dview, dview);
    expect_close("backward in place", dx_cpu, dview, 1e-5);
    CHECK(host(dyg).values()[0] == dy.values()[0]);
  }
}

TEST_CASE("activations on CUDA written in bf16: the float32 results rounded, bit for bit") {
  // Vector and scalar paths, and views two and four bf16 elements in (stores aligned to 4 and
  // 8 bytes, not 16).
  for (std::int64_t n : {1, 7, 33, 1000, 1000003}) {
    for (Activation a : kAll) {
      CAPTURE(n);
      INFO(std::string(ops::activation_name(a)));
      const Tensor xg =
          random_tensor(Shape{n}, static_cast<std::uint64_t>(n) + 5, -3.f, 3.f).to(kGpu);
      Tensor y32 = poisoned(Shape{n});
      ops::activation_forward(a, xg, y32);
      Tensor y16 = ops::to_dtype(poisoned(Shape{n}), DType::BFloat16);
      ops::activation_forward(a, xg, y16);
      expect_equal("forward in bf16", host(ops::to_dtype(y32, DType::BFloat16)), y16);

      for (const std::int64_t offset : {2, 4}) {  // 4-byte and 8-byte (not 16-byte) aligned
        CAPTURE(offset);
        Tensor wide16 = ops::to_dtype(poisoned(Shape{n + offset}), DType::BFloat16);
        Tensor view = wide16.slice(offset, n + offset);
        ops::activation_forward(a, xg, view);
        expect_equal("forward in bf16 into a view", host(ops::to_dtype(y32, DType::BFloat16)),
                     view);
      }
    }
  }
}

TEST_CASE("an activation given tensors on two devices names both") {
  const Tensor xg = random_tensor(Shape{4}, 1).to(kGpu);
  Tensor y = Tensor::empty(Shape{4});
  CHECK_THROWS_WITH_AS(ops::activation_forward(Activation::ReLU, xg, y),
                       doctest::Contains("cuda:0 and cpu"), ConfigError);
  Tensor dx = Tensor::empty(Shape{4}, DType::Float32, kGpu);
  CHECK_THROWS_WITH_AS(
      ops::activation_backward(Activation::GELU, xg, random_tensor(Shape{4}, 2), dx),
      doctest::Contains("activation_backward"), ConfigError);
}

}  // namespace test_activation
