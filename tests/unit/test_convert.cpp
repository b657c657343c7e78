// float32 <-> bfloat16 (ops/convert.hpp): rounding to nearest even, infinities, NaNs, overflow,
// the round trip's error bound, and tensors of either type.
#include <doctest/doctest.h>

#include <pipeline/core/rng.hpp>
#include <pipeline/ops/convert.hpp>

#include <bit>
#include <cmath>
#include <limits>

namespace test_convert {

using namespace pipeline;
using ops::bf16_to_float;
using ops::float_to_bf16;

namespace {
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
}  // namespace

TEST_CASE("float32 to bfloat16 rounds to nearest, ties to even") {
  CHECK(float_to_bf16(1.f) == 0x3f80);
  CHECK(float_to_bf16(-2.f) == 0xc000);
  CHECK(float_to_bf16(0.f) == 0x0000);
  CHECK(float_to_bf16(-0.f) == 0x8000);
  CHECK(float_to_bf16(from_bits(0x3f808000)) == 0x3f80);  // a tie, kept even
  CHECK(float_to_bf16(from_bits(0x3f818000)) == 0x3f82);  // a tie, rounded up to even
  CHECK(float_to_bf16(from_bits(0x3f808001)) == 0x3f81);  // above the tie
  CHECK(float_to_bf16(from_bits(0x3f807fff)) == 0x3f80);  // below the tie
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // beyond bf16: infinity
  CHECK(float_to_bf16(from_bits(0x00000001)) == 0x0000);             // the smallest subnormal
  const std::uint16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bf16_to_float(nan)));
  // A signalling NaN whose payload sits in the low bits stays a NaN, not an infinity.
  CHECK(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001)))));
  CHECK(bf16_to_float(0x3f80) == 1.f);
  CHECK(bf16_to_float(0x4049) == 3.140625f);
}

TEST_CASE("the round trip is within half a bf16 step; tensors convert both ways") {
  Rng rng(3, "convert");
  const std::int64_t n = 1001;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = rng.normal(0.f, 100.f);
  const Tensor x = Tensor::from_vector(Shape{n}, v);
  const Tensor h = ops::to_dtype(x, DType::BFloat16);
  CHECK(h.dtype() == DType::BFloat16);
  CHECK(h.nbytes() == static_cast<std::size_t>(n) * 2);
  const Tensor back = ops::to_dtype(h, DType::Float32);
  CHECK(back.shape() == x.shape());
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = x.data<float>()[i], b = back.data<float>()[i];
    CHECK(std::abs(a - b) <= std::ldexp(std::abs(a), -8));
    CHECK(b == bf16_to_float(float_to_bf16(a)));
    CHECK(float_to_bf16(b) == h.data<std::uint16_t>()[i]);  // bf16 values are exact in float32
  }
  CHECK(ops::to_dtype(x, DType::Float32).raw() == x.raw());  // same type: the tensor itself
  CHECK_THROWS_WITH(ops::to_dtype(Tensor::zeros(Shape{2}, DType::Int32), DType::BFloat16),
                    doctest::Contains("converts between float32 and bfloat16"));
}

}  // namespace test_convert
