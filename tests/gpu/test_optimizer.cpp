// CUDA optimizer steps against the CPU op: SGD without and with momentum (first and later steps,
// dampening, Nesterov, weight decay), Adam and AdamW at the first and a later step, the
// sum of squares of gradient clipping (deterministic) and the in-place scale. One tensor spans
// more chunks than a multi-tensor launch holds, so it continues across launches.
#include <pipeline/ops/optimizer_update.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

namespace test_optimizer {

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {

// 320 chunks of 65536 elements fill one launch; this needs a second.
constexpr std::int64_t kAcrossLaunches = 21'000'003;

}  // namespace

TEST_CASE("SGD on CUDA matches the CPU") {
  struct Config {
    ops::SgdParams p;
    bool first;
  };
  const Config configs[] = {
      {{0.1f, 0.f, 0.f, 0.f, false}, false},     {{0.1f, 0.f, 0.f, 0.01f, false}, false},
      {{0.05f, 0.9f, 0.f, 0.f, false}, true},    {{0.05f, 0.9f, 0.1f, 0.01f, false}, false},
      {{0.05f, 0.9f, 0.f, 0.001f, true}, false}, {{0.05f, 0.9f, 0.f, 0.f, true}, true}};
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1000003},
                         kAcrossLaunches}) {
    for (std::size_t k = 0; k < std::size(configs); ++k) {
      if (n == kAcrossLaunches && k != 3) continue;  // one configuration at the largest size
      CAPTURE(n);
      CAPTURE(k);
      const Config& c = configs[k];
      const auto seed = static_cast<std::uint64_t>(n * 16 + static_cast<std::int64_t>(k));
      const Tensor w0 = random_tensor(Shape{n}, seed), g = random_tensor(Shape{n}, seed + 1);
      const Tensor b0 = random_tensor(Shape{n}, seed + 2);
      Tensor w = w0.clone(), b = b0.clone();
      const bool momentum = c.p.momentum != 0.f;
      ops::sgd_update(w, g, momentum ? &b : nullptr, c.first, c.p);
      Tensor wg = w0.to(kGpu), bg = b0.to(kGpu);
      ops::sgd_update(wg, g.to(kGpu), momentum ? &bg : nullptr, c.first, c.p);
      expect_close("param", w, wg, 1e-5);
      if (momentum) expect_close("momentum buffer", b, bg, 1e-5);
    }
  }
}

TEST_CASE("Adam and AdamW on CUDA match the CPU") {
  ops::AdamWParams adamw;  // decoupled, weight decay 1e-2
  ops::AdamWParams adam_l2{1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, false};
  ops::AdamWParams no_decay{1e-3f, 0.8f, 0.99f, 1e-6f, 0.f, true};
  for (std::int64_t n : {0, 1, 7, 1000003}) {
    for (const ops::AdamWParams& p : {adamw, adam_l2, no_decay}) {
      for (std::int64_t step : {1, 10}) {
        CAPTURE(n);
        CAPTURE(step);
        CAPTURE(p.decoupled);
        CAPTURE(p.weight_decay);
        const auto seed = static_cast<std::uint64_t>(n * 64 + step);
        const Tensor w0 = random_tensor(Shape{n}, seed), g = random_tensor(Shape{n}, seed + 1);
        // Moments as after some steps: m of either sign, v positive.
        const Tensor m0 = random_tensor(Shape{n}, seed + 2, -0.1f, 0.1f);
        const Tensor v0 = random_tensor(Shape{n}, seed + 3, 1e-4f, 1e-2f);
        Tensor w = w0.clone(), m = m0.clone(), v = v0.clone();
        ops::adamw_update(w, g, m, v, step, p);
        Tensor wg = w0.to(kGpu), mg = m0.to(kGpu), vg = v0.to(kGpu);
        ops::adamw_update(wg, g.to(kGpu), mg, vg, step, p);
        expect_close("param", w, wg, 1e-5);
        expect_close("exp_avg", m, mg, 1e-5);
        expect_close("exp_avg_sq", v, vg, 1e-5);
      }
    }
  }
}

TEST_CASE("sum of squares on CUDA matches the CPU and is deterministic; scale is exact") {
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{4097},
                         std::int64_t{1000003}, kAcrossLaunches}) {
    CAPTURE(n);
    const Tensor x = random_tensor(Shape{n}, static_cast<std::uint64_t>(n), -2.f, 2.f);
    const Tensor xg = x.to(kGpu);
    const double cpu = ops::sum_of_squares(x);
    const double gpu = ops::sum_of_squares(xg);
    CHECK(gpu == doctest::Approx(cpu).epsilon(1e-5));
    CHECK(ops::sum_of_squares(xg) == gpu);  // bit for bit on a second run
    if (n == 0) CHECK(gpu == 0.0);

    Tensor s = x.clone(), sg = x.to(kGpu);
    ops::scale_inplace(s, 0.37f);
    ops::scale_inplace(sg, 0.37f);
    expect_equal("scale", s, sg);
  }
}

TEST_CASE("optimizer ops given tensors on two devices name both") {
  Tensor wg = random_tensor(Shape{5}, 1).to(kGpu);
  const Tensor g = random_tensor(Shape{5}, 2);
  CHECK_THROWS_WITH_AS(ops::sgd_update(wg, g, nullptr, true, ops::SgdParams{}),
                       doctest::Contains("sgd_update: its tensors are on cuda:0 and cpu"),
                       ConfigError);
  Tensor m = Tensor::zeros(Shape{5}, DType::Float32, kGpu), v = m.clone();
  CHECK_THROWS_WITH_AS(ops::adamw_update(wg, g, m, v, 1, ops::AdamWParams{}),
                       doctest::Contains("adamw_update"), ConfigError);
}

TEST_CASE("multi-tensor SGD and AdamW steps equal the per-tensor steps bit for bit") {
  // Sizes around the kernel's 65536-element chunks, and odd ones.
  const std::vector<std::int64_t> sizes = {1, 7, 33, 1000, 65536, 65537, 200003};
  auto make = [&](std::uint64_t seed) {
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      out.push_back(random_tensor(Shape{sizes[i]}, seed + i).to(kGpu));
    return out;
  };
  auto same_bits = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      const Tensor x = a[i].to(Device::cpu()), y = b[i].to(Device::cpu());
      if (std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0) return false;
    }
    return true;
  };
  auto clone_all = [](const std::vector<Tensor>& a) {
    std::vector<Tensor> out;
    for (const Tensor& t : a) out.push_back(t.clone());
    return out;
  };
  const std::vector<Tensor> grads = make(200);
  {
    std::vector<Tensor> one = make(100), buf_one = make(300);
    std::vector<Tensor> many = clone_all(one), buf_many = clone_all(buf_one);
    const ops::SgdParams p{0.05f, 0.9f, 0.1f, 1e-3f, false};
    for (std::size_t i = 0; i < one.size(); ++i)
      ops::sgd_update(one[i], grads[i], &buf_one[i], false, p);
    std::vector<Tensor*> bufs;
    for (Tensor& b : buf_many) bufs.push_back(&b);
    ops::sgd_update_many(many, grads, bufs, false, p);
    CHECK(same_bits(one, many));
    CHECK(same_bits(buf_one, buf_many));
  }
  {
    std::vector<Tensor> one = make(400), m_one = make(500), v_one = make(600);
    for (Tensor& v : v_one) v = random_tensor(v.shape(), 601, 0.1f, 1.f).to(kGpu);  // v >= 0
    std::vector<Tensor> many = clone_all(one), m_many = clone_all(m_one), v_many = clone_all(v_one);
    const ops::AdamWParams p{1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, true};
    for (std::size_t i = 0; i < one.size(); ++i)
      ops::adamw_update(one[i], grads[i], m_one[i], v_one[i], 3, p);
    ops::adamw_update_many(many, grads, m_many, v_many, 3, p);
    CHECK(same_bits(one, many));
    CHECK(same_bits(m_one, m_many));
    CHECK(same_bits(v_one, v_many));
  }
}

TEST_CASE("sums_of_squares of many tensors equals sum_of_squares of each, bit for bit") {
  std::vector<Tensor> xs;
  for (const std::int64_t n : {1, 7, 33, 1000, 65537, 1 << 20})
    xs.push_back(random_tensor(Shape{n}, 700 + static_cast<std::uint64_t>(n)).to(kGpu));
  const std::vector<double> all = ops::sums_of_squares(xs);
  REQUIRE(all.size() == xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CHECK(all[i] == ops::sum_of_squares(xs[i]));
    CHECK(all[i] == doctest::Approx(ops::sum_of_squares(xs[i].to(Device::cpu()))).epsilon(1e-6));
  }
}

}  // namespace test_optimizer
