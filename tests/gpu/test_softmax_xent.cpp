// CUDA fused softmax cross-entropy against the CPU op: loss, correct count (exact) and the scaled
// gradient over class counts on both sides of the kernel's register-cached limit (8192), rows not
// a multiple of anything, ties (first maximum), large logits, an empty batch and a bad label.
#include <pipeline/ops/softmax_xent.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {

void compare(const Tensor& logits, const Tensor& labels, float scale) {
  Tensor g_cpu = Tensor::empty(logits.shape());
  const ops::SoftmaxXentResult r_cpu = ops::softmax_cross_entropy(logits, labels, scale, g_cpu);
  Tensor g_gpu = poisoned(logits.shape());
  const ops::SoftmaxXentResult r_gpu =
      ops::softmax_cross_entropy(logits.to(kGpu), labels.to(kGpu), scale, g_gpu);
  CHECK(r_gpu.count == r_cpu.count);
  CHECK(r_gpu.correct == r_cpu.correct);
  CHECK(r_gpu.loss == doctest::Approx(r_cpu.loss).epsilon(1e-5));
  expect_close("gradient", g_cpu, g_gpu, 1e-5);
}

}  // namespace

TEST_CASE("softmax cross-entropy on CUDA matches the CPU") {
  for (std::int64_t classes : {1, 7, 10, 33, 256, 512, 513, 1000, 8192, 8193, 32000, 70000}) {
    for (std::int64_t rows : {1, 7, 33, 1000}) {
      if (rows * classes > 40'000'000) continue;
      CAPTURE(classes);
      CAPTURE(rows);
      const auto seed = static_cast<std::uint64_t>(classes * 1009 + rows);
      const Tensor logits = random_tensor(Shape{rows, classes}, seed, -4.f, 4.f);
      const Tensor labels = random_ints(Shape{rows}, seed + 1, static_cast<std::int32_t>(classes));
      compare(logits, labels, 1.f / static_cast<float>(rows));
    }
  }
}

TEST_CASE("softmax cross-entropy on CUDA: labels shaped like the batch, logits [B, T, C]") {
  const Tensor logits = random_tensor(Shape{3, 37, 259}, 5, -6.f, 6.f);
  const Tensor labels = random_ints(Shape{3, 37}, 6, 259);
  compare(logits, labels, 0.25f);
}

TEST_CASE("softmax cross-entropy on CUDA: ties take the first maximum, large logits are stable") {
  for (std::int64_t classes : {5, 300, 9000, 70000}) {
    CAPTURE(classes);
    const std::int64_t rows = 4;
    Tensor logits = random_tensor(Shape{rows, classes}, 7, -1.f, 1.f);
    float* z = logits.data<float>();
    // Rows 0 and 1: two equal maxima (at 1 and classes - 1); row 2: all equal; row 3: shifted
    // by 1e4, which overflows exp without the row maximum subtracted.
    z[0 * classes + 1] = z[0 * classes + classes - 1] = 3.f;
    z[1 * classes + 1] = z[1 * classes + classes - 1] = 3.f;
    for (std::int64_t c = 0; c < classes; ++c) {
      z[2 * classes + c] = 0.5f;
      z[3 * classes + c] += 1e4f;
    }
    const std::int32_t last = static_cast<std::int32_t>(classes - 1);
    const Tensor labels = Tensor::from_ints(Shape{rows}, {1, last, 0, 2});
    compare(logits, labels, 1.f / static_cast<float>(rows));
  }
}

TEST_CASE("softmax cross-entropy on CUDA: an empty batch scores nothing") {
  const Tensor logits = Tensor::empty(Shape{0, 10}, DType::Float32, kGpu);
  const Tensor labels = Tensor::empty(Shape{0}, DType::Int32, kGpu);
  Tensor grad = Tensor::empty(Shape{0, 10}, DType::Float32, kGpu);
  const ops::SoftmaxXentResult r = ops::softmax_cross_entropy(logits, labels, 1.f, grad);
  CHECK(r.count == 0);
  CHECK(r.correct == 0);
  CHECK(r.loss == 0.0);
}

TEST_CASE("softmax cross-entropy on CUDA: a bad label is a ConfigError and nothing is written") {
  const std::int64_t rows = 50, classes = 7;
  const Tensor logits = random_tensor(Shape{rows, classes}, 8).to(kGpu);
  Tensor labels_host = random_ints(Shape{rows}, 9, static_cast<std::int32_t>(classes));
  labels_host.data<std::int32_t>()[31] = 7;   // the first bad one
  labels_host.data<std::int32_t>()[40] = -1;  // a later one
  Tensor grad = Tensor::full(Shape{rows, classes}, 5.f, kGpu);
  CHECK_THROWS_WITH_AS(ops::softmax_cross_entropy(logits, labels_host.to(kGpu), 1.f, grad),
                       doctest::Contains("label 7 of sample 31 is outside [0, 7)"), ConfigError);
  expect_equal("untouched gradient", Tensor::full(Shape{rows, classes}, 5.f), grad);
  // Labels on the host with logits on the device: both devices named.
  CHECK_THROWS_WITH_AS(ops::softmax_cross_entropy(logits, labels_host, 1.f, grad),
                       doctest::Contains("cuda:0 and cpu"), ConfigError);
}
