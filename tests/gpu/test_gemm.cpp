// ops::gemm on CUDA (cuBLASLt) against the CPU gemm: every transpose, alpha/beta, odd and empty
// shapes, fp32 and TF32; the fused bias and bias+ReLU epilogues against gemm, add_bias and relu on
// the CPU, and ops::gemm_bias in fp32 and bf16; a mixed-device call is refused.
#include <pipeline/core/rng.hpp>
#include <pipeline/cuda/blas.hpp>
#include <pipeline/cuda/stream.hpp>
#include <pipeline/ops/activation.hpp>
#include <pipeline/ops/bias.hpp>
#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/gemm.hpp>
#include <pipeline/ops/precision.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace test_gemm {

using namespace pipeline;

namespace {

Tensor random(Shape shape, Rng& rng) {
  Tensor t = Tensor::empty(std::move(shape));
  for (float& v : t.values()) v = rng.uniform(-1.f, 1.f);
  return t;
}

// max |x - y| / (max |y| + tiny), with the first mismatches printed.
double normalized_error(const Tensor& got, const Tensor& want) {
  const auto g = got.to(Device::cpu()).to_vector();
  const auto w = want.to_vector();
  REQUIRE(g.size() == w.size());
  double scale = 1e-30, err = 0;
  for (float v : w) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  int shown = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double e = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (e / scale > 1e-5 && shown++ < 5) MESSAGE("index ", i, ": gpu ", g[i], ", cpu ", w[i]);
    err = std::max(err, e);
  }
  return err / scale;
}

}  // namespace

TEST_CASE("gemm on CUDA equals the CPU gemm for every transpose and alpha, beta") {
  Rng rng(3, "gemm-gpu");
  struct Dims {
    std::int64_t m, n, k;
  };
  for (const Dims d : {Dims{1, 1, 1}, Dims{7, 5, 3}, Dims{64, 128, 96}, Dims{257, 33, 511},
                       Dims{5, 9, 0}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const Tensor a = random(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, rng);
      const Tensor b = random(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, rng);
      for (const float beta : {0.f, 1.f, 0.5f}) {
        Tensor c = random(Shape{d.m, d.n}, rng);
        Tensor c_gpu = c.to(Device::cuda(0));
        ops::gemm(a, ta, b, tb, c, 0.75f, beta);
        ops::gemm(a.to(Device::cuda(0)), ta, b.to(Device::cuda(0)), tb, c_gpu, 0.75f, beta);
        CAPTURE(d.m);
        CAPTURE(d.n);
        CAPTURE(d.k);
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(beta);
        CHECK(normalized_error(c_gpu, c) <= 1e-5);
      }
    }
  }
}

// Views that start past a whole allocation (a microbatch's rows, a slice): cuBLASLt is told each
// operand's alignment, down to 4 bytes, so that it offers no algorithm the call would refuse; the
// same shapes at full alignment keep their own cached algorithm. The aligned shapes run first, so
// a cache that kept their choice for the offset views would fail here.
TEST_CASE("gemm on CUDA over row slices that start 4, 8, 16 or 256 bytes into a tensor") {
  Rng rng(5, "gemm-gpu-views");
  const std::int64_t m = 96, n = 80, k = 72;
  for (const std::int64_t skip : {0, 1, 2, 4, 64}) {  // floats skipped: 0, 4 to 256 bytes
    CAPTURE(skip);
    const Tensor a_all = random(Shape{m + skip, k}, rng), b_all = random(Shape{k + skip, n}, rng);
    const Tensor a = a_all.reshape({(m + skip) * k}).slice(skip, skip + m * k).reshape({m, k});
    const Tensor b = b_all.reshape({(k + skip) * n}).slice(skip, skip + k * n).reshape({k, n});
    Tensor c_all = random(Shape{(m * n + skip)}, rng);
    Tensor c = c_all.slice(skip, skip + m * n).reshape({m, n});
    Tensor c_gpu_all = c_all.to(Device::cuda(0));
    Tensor c_gpu = c_gpu_all.slice(skip, skip + m * n).reshape({m, n});
    const Tensor a_gpu_all = a_all.reshape({(m + skip) * k}).to(Device::cuda(0));
    const Tensor b_gpu_all = b_all.reshape({(k + skip) * n}).to(Device::cuda(0));
    const Tensor a_gpu = a_gpu_all.slice(skip, skip + m * k).reshape({m, k});
    const Tensor b_gpu = b_gpu_all.slice(skip, skip + k * n).reshape({k, n});
    ops::gemm(a, false, b, false, c, 1.f, 1.f);
    ops::gemm(a_gpu, false, b_gpu, false, c_gpu, 1.f, 1.f);
    CHECK(normalized_error(c_gpu, c) <= 1e-5);
    // A bias view off 16 bytes: cuBLASLt takes no alignment preference for it, so its epilogue
    // runs as a pass of its own there.
    const Tensor bias_all = random(Shape{n + skip}, rng);
    const Tensor bias = bias_all.slice(skip, skip + n);
    const Tensor bias_gpu = bias_all.to(Device::cuda(0)).slice(skip, skip + n);
    Tensor want = Tensor::zeros(Shape{m, n});
    Tensor got = Tensor::zeros(Shape{m, n}, DType::Float32, Device::cuda(0));
    ops::gemm_bias(a, false, b, false, bias, want);
    ops::gemm_bias(a_gpu, false, b_gpu, false, bias_gpu, got);
    CHECK(normalized_error(got, want) <= 1e-5);
  }
}

TEST_CASE("TF32 is off by default and, when allowed, within TF32 rounding") {
  CHECK(!cuda::allow_tf32());
  Rng rng(4, "gemm-tf32");
  const Tensor a = random(Shape{128, 256}, rng), b = random(Shape{256, 64}, rng);
  const Tensor want = ops::matmul(a, false, b, false);
  cuda::set_allow_tf32(true);
  const Tensor got = ops::matmul(a.to(Device::cuda(0)), false, b.to(Device::cuda(0)), false);
  cuda::set_allow_tf32(false);
  CHECK(got.device() == Device::cuda(0));
  CHECK(normalized_error(got, want) <= 1e-2);
}

TEST_CASE("bias and bias+ReLU epilogues equal gemm, add_bias and relu") {
  Rng rng(5, "gemm-epilogue");
  const std::int64_t m = 37, n = 70, k = 45;
  const Tensor x = random(Shape{m, k}, rng), w = random(Shape{n, k}, rng), bias = random(Shape{n}, rng);
  Tensor want = ops::matmul(x, false, w, true);
  ops::add_bias(want, bias);
  Tensor want_relu = Tensor::empty(want.shape());
  ops::activation_forward(ops::Activation::ReLU, want, want_relu);
  const Tensor xd = x.to(Device::cuda(0)), wd = w.to(Device::cuda(0)), bd = bias.to(Device::cuda(0));
  for (const auto epilogue : {cuda::GemmEpilogue::Bias, cuda::GemmEpilogue::ReluBias}) {
    Tensor y = Tensor::empty(Shape{m, n}, DType::Float32, Device::cuda(0));
    cuda::gemm_f32(cuda::current_stream(0), 0, false, true, m, n, k, 1.f, xd.device_data<float>(), k,
                   wd.device_data<float>(), k, 0.f, y.device_data<float>(), n, epilogue,
                   bd.device_data<float>());
    CHECK(normalized_error(y, epilogue == cuda::GemmEpilogue::Bias ? want : want_relu) <= 1e-5);
  }
}

// The op Linear calls: the bias in the product's epilogue, in fp32 and on the bf16 tensor cores,
// over shapes from one row to a transformer block's, C poisoned so an unwritten element fails.
TEST_CASE("gemm_bias on cuda:0 equals gemm then add_bias on the CPU, fp32 and bf16") {
  Rng rng(7, "gemm-bias");
  for (const DType dtype : {DType::Float32, DType::BFloat16})
    for (const auto [m, n, k] :
         {std::array<std::int64_t, 3>{1, 7, 33}, std::array<std::int64_t, 3>{33, 1000, 7},
          std::array<std::int64_t, 3>{512, 3072, 1024}}) {
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(dtype_name(dtype));
      const ops::ComputeDTypeScope scope(dtype);
      const Tensor x = random(Shape{m, k}, rng), w = random(Shape{n, k}, rng),
                   bias = random(Shape{n}, rng);
      Tensor want = Tensor::empty(Shape{m, n});
      ops::gemm_bias(x, false, w, true, bias, want);  // the CPU: gemm, then add_bias
      Tensor y = Tensor::full(Shape{m, n}, std::nanf(""), Device::cuda(0));
      ops::gemm_bias(x.to(Device::cuda(0)), false, w.to(Device::cuda(0)), true,
                     bias.to(Device::cuda(0)), y);
      CHECK(normalized_error(y, want) <= 1e-5);
    }
}

// A product written in bf16 by cuBLASLt (rounded once as it is stored) against the same product
// written in fp32 and then rounded: at most one bf16 step apart (2^-8 relative), where the two
// algorithms accumulate in different orders; C poisoned so an unwritten element fails.
TEST_CASE("gemm into a bf16 result on cuda:0: the fp32 result rounded, to one bf16 step") {
  Rng rng(8, "gemm-bf16-result");
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  // Odd n (a bf16 row stride of 2 mod 4 bytes) and odd k among them, every transpose: where
  // cuBLASLt writes no bf16 result the fp32 product is rounded, the same values.
  for (const bool with_bias : {false, true})
    for (const auto [m, n, k] :
         {std::array<std::int64_t, 3>{1, 8, 33}, std::array<std::int64_t, 3>{33, 1000, 8},
          std::array<std::int64_t, 3>{7, 135, 45}, std::array<std::int64_t, 3>{5, 7, 9},
          std::array<std::int64_t, 3>{512, 3072, 1024}})
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(t);
        CAPTURE(with_bias);
        const Device gpu = Device::cuda(0);
        const Tensor x = random(ta ? Shape{k, m} : Shape{m, k}, rng).to(gpu),
                     w = random(tb ? Shape{n, k} : Shape{k, n}, rng).to(gpu),
                     bias = random(Shape{n}, rng).to(gpu);
        Tensor y32 = Tensor::empty(Shape{m, n}, DType::Float32, gpu);
        Tensor y16 = ops::to_dtype(Tensor::full(Shape{m, n}, std::nanf(""), gpu), DType::BFloat16);
        if (with_bias) {
          ops::gemm_bias(x, ta, w, tb, bias, y32);
          ops::gemm_bias(x, ta, w, tb, bias, y16);
        } else {
          ops::gemm(x, ta, w, tb, y32);
          ops::gemm(x, ta, w, tb, y16);
        }
        const Tensor want = ops::to_dtype(y32, DType::BFloat16).to(Device::cpu());
        const Tensor got = y16.to(Device::cpu());
        REQUIRE(got.dtype() == DType::BFloat16);
        const auto* a = want.data<std::uint16_t>();
        const auto* b = got.data<std::uint16_t>();
        double squares = 0;
        for (std::int64_t i = 0; i < want.numel(); ++i)
          squares += std::pow(static_cast<double>(ops::bf16_to_float(a[i])), 2);
        // One bf16 step of the element, or of the orders' fp32 difference where a sum cancels
        // (a ten-thousandth of the elements' root mean square).
        const double floor = 1e-4 * std::sqrt(squares / static_cast<double>(want.numel()));
        std::int64_t far = 0;
        for (std::int64_t i = 0; i < want.numel(); ++i) {
          const double u = ops::bf16_to_float(a[i]), v = ops::bf16_to_float(b[i]);
          if (!(std::abs(u - v) <= std::abs(u) / 128 + floor))  // NaN (unwritten) fails too
            ++far;
        }
        CHECK(far == 0);
      }
  Tensor c = Tensor::empty(Shape{2, 2}, DType::BFloat16, Device::cuda(0));
  const Tensor a = random(Shape{2, 2}, rng).to(Device::cuda(0));
  CHECK_THROWS_WITH_AS(ops::gemm(a, false, a, false, c, 1.f, 1.f),
                       doctest::Contains("never accumulated into"), Error);
  // A bias left on the host is refused by name, not handed to the epilogue as a host pointer.
  CHECK_THROWS_WITH_AS(ops::gemm_bias(a, false, a, true, random(Shape{2}, rng), c),
                       doctest::Contains("gemm_bias: its tensors are on cuda:0 and cpu"),
                       ConfigError);
}

TEST_CASE("gemm with tensors on two devices is refused naming both") {
  Rng rng(6, "gemm-mixed");
  const Tensor a = random(Shape{4, 4}, rng);
  Tensor c = Tensor::zeros(Shape{4, 4}, DType::Float32, Device::cuda(0));
  CHECK_THROWS_WITH_AS(ops::gemm(a, false, a, false, c), doctest::Contains("cpu and cuda:0"),
                       ConfigError);
}

}  // namespace test_gemm
