// CUDA fused softmax cross-entropy against the CPU op: loss, correct count (exact) and the scaled
// gradient over class counts on both sides of each kernel's limits (a warp per row up to 512, a
// block in registers up to 8192, a cluster of blocks or the row in shared memory, two reads),
// with float4 accesses and without (classes not a multiple of 4, logits not 16-byte aligned),
// more rows than the device holds blocks (so every block strides), ties (first maximum), large
// logits, an empty batch and bad labels.
#include <pipeline/ops/softmax_xent.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>
#include <vector>

namespace test_softmax_xent {

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
    for (std::int64_t rows : {1, 7, 33, 1000, 20000}) {
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

TEST_CASE(
    "softmax cross-entropy on CUDA: long rows over a cluster of blocks and in shared memory") {
  // Both kernels for rows longer than a block's registers hold: every block of a cluster takes a
  // slice (the last one shorter, or empty), float4 and single-float accesses, one row, fewer
  // rows than clusters, and more rows than the device holds clusters.
  for (bool clusters : {true, false}) {
    CAPTURE(clusters);
    ops::set_softmax_xent_clusters(clusters);
    for (std::int64_t classes : {8193, 8200, 12000, 32000, 32001, 32768, 70000, 131072})
      for (std::int64_t rows : {1, 5, 700}) {
        if (rows * classes > 40'000'000) continue;
        CAPTURE(classes);
        CAPTURE(rows);
        const auto seed = static_cast<std::uint64_t>(classes * 31 + rows);
        compare(random_tensor(Shape{rows, classes}, seed, -4.f, 4.f),
                random_ints(Shape{rows}, seed + 1, static_cast<std::int32_t>(classes)), 0.25f);
      }
  }
  ops::set_softmax_xent_clusters(true);
}

TEST_CASE("softmax cross-entropy on CUDA: logits and labels not 16-byte aligned") {
  for (std::int64_t classes : {8, 256, 12000}) {
    CAPTURE(classes);
    const std::int64_t rows = 37;
    // One float (one label) in: every row starts 4 bytes past a 16-byte boundary.
    const Tensor flat = random_tensor(Shape{rows * classes + 1}, 11, -4.f, 4.f);
    const Tensor logits = flat.slice(1, rows * classes + 1).reshape(Shape{rows, classes});
    const Tensor labels =
        random_ints(Shape{rows + 1}, 12, static_cast<std::int32_t>(classes)).slice(1, rows + 1);
    Tensor g_cpu = Tensor::empty(logits.shape());
    const ops::SoftmaxXentResult r_cpu = ops::softmax_cross_entropy(logits, labels, 0.5f, g_cpu);
    const Tensor flat_gpu = flat.to(kGpu);
    const Tensor logits_gpu = flat_gpu.slice(1, rows * classes + 1).reshape(Shape{rows, classes});
    const Tensor labels_gpu = random_ints(Shape{rows + 1}, 12, static_cast<std::int32_t>(classes))
                                  .to(kGpu)
                                  .slice(1, rows + 1);
    Tensor g_flat = poisoned(Shape{rows * classes + 1});
    Tensor g_gpu = g_flat.slice(1, rows * classes + 1).reshape(Shape{rows, classes});
    const ops::SoftmaxXentResult r_gpu =
        ops::softmax_cross_entropy(logits_gpu, labels_gpu, 0.5f, g_gpu);
    CHECK(r_gpu.correct == r_cpu.correct);
    CHECK(r_gpu.loss == doctest::Approx(r_cpu.loss).epsilon(1e-5));
    expect_close("gradient", g_cpu, g_gpu, 1e-5);
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
  // Many labels (read four at a time): the first bad one is found wherever it lies.
  const std::int64_t many = 70001;
  const Tensor wide = random_tensor(Shape{many, 4}, 10).to(kGpu);
  Tensor wide_grad = Tensor::empty(Shape{many, 4}, DType::Float32, kGpu);
  for (std::int64_t first : {0L, 1L, 4097L, 69998L, 70000L}) {
    CAPTURE(first);
    Tensor bad = random_ints(Shape{many}, 13, 4);
    bad.data<std::int32_t>()[first] = 4 + static_cast<std::int32_t>(first % 3);
    if (first + 1 < many) bad.data<std::int32_t>()[many - 1] = -3;  // a later one
    const std::string expected =
        fmt::format("label {} of sample {} is outside [0, 4)", 4 + first % 3, first);
    CHECK_THROWS_WITH_AS(ops::softmax_cross_entropy(wide, bad.to(kGpu), 1.f, wide_grad),
                         doctest::Contains(expected.c_str()), ConfigError);
  }
  // Labels on the host with logits on the device: both devices named.
  CHECK_THROWS_WITH_AS(ops::softmax_cross_entropy(logits, labels_host, 1.f, grad),
                       doctest::Contains("cuda:0 and cpu"), ConfigError);
}

TEST_CASE("softmax cross-entropy on CUDA: totals accumulated on the device equal the host's") {
  Tensor totals = Tensor::zeros(Shape{4}, DType::Int64, kGpu);  // four doubles
  double loss = 0, correct = 0;
  for (std::int64_t classes : {10, 256, 32000}) {
    CAPTURE(classes);
    const std::int64_t rows = 300;
    const Tensor logits = random_tensor(Shape{rows, classes}, 20, -4.f, 4.f).to(kGpu);
    const Tensor labels = random_ints(Shape{rows}, 21, static_cast<std::int32_t>(classes)).to(kGpu);
    Tensor g_sync = poisoned(Shape{rows, classes});
    Tensor g_async = poisoned(Shape{rows, classes});
    const ops::SoftmaxXentResult r = ops::softmax_cross_entropy(logits, labels, 0.125f, g_sync);
    ops::softmax_cross_entropy_accumulate(logits, labels, 0.125f, g_async, totals);
    expect_equal("gradient", g_sync.to(Device::cpu()), g_async.to(Device::cpu()));
    loss += r.loss;
    correct += static_cast<double>(r.correct);
    const Tensor t = totals.to(Device::cpu());
    const double* d = static_cast<const double*>(t.raw());
    CHECK(d[0] == loss);  // the same partials added in the same order
    CHECK(d[1] == correct);
    CHECK(d[2] == 0.0);
  }
  // A bad label: grad untouched, its row + 1 and value recorded once; later calls keep the first.
  const Tensor logits = random_tensor(Shape{40, 12}, 22).to(kGpu);
  for (std::int32_t row : {17, 5}) {
    Tensor labels = random_ints(Shape{40}, 23, 12);
    labels.data<std::int32_t>()[row] = 12 + row;
    Tensor grad = Tensor::full(Shape{40, 12}, 5.f, kGpu);
    ops::softmax_cross_entropy_accumulate(logits, labels.to(kGpu), 1.f, grad, totals);
    expect_equal("untouched gradient", Tensor::full(Shape{40, 12}, 5.f), grad);
  }
  const Tensor t = totals.to(Device::cpu());
  const double* d = static_cast<const double*>(t.raw());
  CHECK(d[0] == loss);
  CHECK(d[2] == 18.0);
  CHECK(d[3] == 29.0);
}

}  // namespace test_softmax_xent
