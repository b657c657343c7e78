// CUDA dropout against the CPU op: the mask drawn on the device is bit for bit the CPU's (same
// seed and key, element i from draw i of the same xoshiro256** stream, reached by jumping
// ahead), over sizes around the kernel's 1024-draw blocks and one needing jumps of many levels;
// dropout() and apply_mask() on the device; p = 0 and p = 1.
#include <pipeline/ops/dropout.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

namespace test_dropout {

using namespace pipeline;
using namespace pipeline::gpu_test;

TEST_CASE("dropout masks on CUDA are the CPU's, bit for bit") {
  for (std::int64_t n : {0, 1, 7, 1000, 1023, 1024, 1025, 4096, 1000003}) {
    for (float p : {0.f, 0.1f, 0.5f, 0.9f, 1.f}) {
      for (const char* key : {"fc1.dropout", "blocks.3.attn_dropout"}) {
        CAPTURE(n);
        CAPTURE(p);
        CAPTURE(key);
        const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(n);
        const Tensor cpu = ops::dropout_mask(Shape{n}, p, seed, key);
        const Tensor gpu = ops::dropout_mask(Shape{n}, p, seed, key, kGpu);
        CHECK(gpu.device() == kGpu);
        expect_equal("mask", cpu, gpu);
      }
    }
  }
}

TEST_CASE("dropout masks on CUDA: a long mask (jumps of many levels), shaped") {
  const Shape shape{7, 1001, 7001};  // 49,056,007 elements: starts up to 2^15 · 1024 draws in
  const Tensor cpu = ops::dropout_mask(shape, 0.25f, 77, "big");
  const Tensor gpu = ops::dropout_mask(shape, 0.25f, 77, "big", kGpu);
  CHECK(gpu.shape() == shape);
  expect_equal("mask", cpu, gpu);
}

TEST_CASE("dropout and apply_mask on CUDA match the CPU exactly") {
  for (std::int64_t n : {0, 1, 33, 100003}) {
    CAPTURE(n);
    const Tensor x = random_tensor(Shape{n}, static_cast<std::uint64_t>(n));
    Tensor mask_cpu, mask_gpu;
    const Tensor y_cpu = ops::dropout(x, 0.3f, 5, "d", mask_cpu);
    const Tensor y_gpu = ops::dropout(x.to(kGpu), 0.3f, 5, "d", mask_gpu);
    CHECK(mask_gpu.device() == kGpu);
    CHECK(y_gpu.device() == kGpu);
    expect_equal("mask", mask_cpu, mask_gpu);
    expect_equal("y", y_cpu, y_gpu);

    // The backward is the same op, here in place on the device.
    const Tensor dy = random_tensor(Shape{n}, static_cast<std::uint64_t>(n) + 1);
    Tensor dx_cpu = Tensor::empty(Shape{n});
    ops::apply_mask(dy, mask_cpu, dx_cpu);
    Tensor dg = dy.to(kGpu);
    ops::apply_mask(dg, mask_gpu, dg);
    expect_equal("dx", dx_cpu, dg);
  }
}

TEST_CASE("apply_mask given tensors on two devices names both") {
  const Tensor x = random_tensor(Shape{8}, 1).to(kGpu);
  const Tensor mask = ops::dropout_mask(Shape{8}, 0.5f, 1, "k");  // on the CPU
  Tensor y = Tensor::empty(Shape{8}, DType::Float32, kGpu);
  CHECK_THROWS_WITH_AS(ops::apply_mask(x, mask, y),
                       doctest::Contains("dropout: its tensors are on cuda:0 and cpu"),
                       ConfigError);
}

}  // namespace test_dropout
