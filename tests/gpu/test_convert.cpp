// float32 <-> bfloat16 on the GPU against the CPU op: bit for bit, over odd sizes and large ones,
// with ties, infinities, NaNs and values beyond bf16's range among the inputs.
#include <doctest/doctest.h>

#include <pipeline/ops/convert.hpp>

#include "gpu_compare.hpp"

#include <bit>
#include <cstring>
#include <limits>

namespace test_convert {

using namespace pipeline;
using pipeline::gpu_test::kGpu;
using pipeline::gpu_test::random_tensor;

TEST_CASE("to_dtype on cuda:0 equals the CPU bit for bit, both ways") {
  for (const std::int64_t n : {1, 7, 33, 1000, 1 << 20}) {
    CAPTURE(n);
    Tensor x = random_tensor(Shape{n}, 40 + static_cast<std::uint64_t>(n), -3e3f, 3e3f);
    float* v = x.data<float>();
    const float special[] = {std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u),
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::max(), 1e-40f};
    for (std::int64_t i = 0; i < n && i < 7; ++i) v[i] = special[i];
    const Tensor want = ops::to_dtype(x, DType::BFloat16);
    const Tensor wide_want = ops::to_dtype(want, DType::Float32);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // Each conversion first leaves a block of NaNs of its output's size in the caching pool,
    // which the conversion then gets back: an element it forgot to write stays NaN.
    (void)ops::to_dtype(Tensor::full(Shape{n}, nan, kGpu), DType::BFloat16);
    const Tensor got = ops::to_dtype(x.to(kGpu), DType::BFloat16).to(Device::cpu());
    REQUIRE(got.dtype() == DType::BFloat16);
    CHECK(std::memcmp(got.raw(), want.raw(), want.nbytes()) == 0);
    const Tensor narrow = want.to(kGpu);
    (void)Tensor::full(Shape{n}, nan, kGpu);
    const Tensor wide = ops::to_dtype(narrow, DType::Float32).to(Device::cpu());
    CHECK(std::memcmp(wide.raw(), wide_want.raw(), wide_want.nbytes()) == 0);
  }
}

// Views that start one element into their storage are not four-element aligned: the kernels'
// one-at-a-time path must convert them as exactly.
TEST_CASE("to_dtype on cuda:0 equals the CPU on unaligned views") {
  const std::int64_t n = 4099;
  const Tensor x = random_tensor(Shape{n}, 91, -50.f, 50.f);
  const Tensor view = x.to(kGpu).slice(1, n);
  const Tensor want = ops::to_dtype(x.slice(1, n), DType::BFloat16);
  const Tensor got = ops::to_dtype(view, DType::BFloat16).to(Device::cpu());
  CHECK(std::memcmp(got.raw(), want.raw(), want.nbytes()) == 0);
  const Tensor narrow = ops::to_dtype(x, DType::BFloat16).to(kGpu).slice(1, n);
  const Tensor wide = ops::to_dtype(narrow, DType::Float32).to(Device::cpu());
  const Tensor wide_want = ops::to_dtype(want, DType::Float32);
  CHECK(std::memcmp(wide.raw(), wide_want.raw(), wide_want.nbytes()) == 0);
}

}  // namespace test_convert
