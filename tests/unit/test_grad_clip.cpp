#include <pipeline/core/rng.hpp>
#include <pipeline/optim/grad_clip.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace test_grad_clip {

using namespace pipeline;

namespace {
std::vector<Tensor> random_grads(std::uint64_t seed, float stddev) {
  Rng rng(seed);
  std::vector<Tensor> g{Tensor::empty({7, 5}), Tensor::empty({5}), Tensor::empty({100'003}),
                        Tensor::empty({3, 1, 2})};
  for (auto& t : g) rng.fill_normal(t, 0.f, stddev);
  return g;
}
double norm_of(const std::vector<Tensor>& g) {
  double s = 0;
  for (auto& t : g)
    for (float v : t.values()) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}
}  // namespace

TEST_CASE("clip_grad_norm scales the global norm down to max_norm") {
  auto g = random_grads(1, 1.f);
  const double before = norm_of(g);
  const double reported = clip_grad_norm(g, 2.f);
  CHECK(reported == doctest::Approx(before).epsilon(1e-6));  // float blocks, double total
  CHECK(norm_of(g) == doctest::Approx(2.0).epsilon(1e-5));

  // Below the bound nothing changes.
  auto small = random_grads(2, 1e-4f);
  auto copy = small[2].to_vector();
  clip_grad_norm(small, 1000.f);
  CHECK(small[2].to_vector() == copy);
}

TEST_CASE("The split form over stages equals the one-process form") {
  auto whole = random_grads(3, 0.5f);
  std::vector<Tensor> split;
  for (auto& t : whole) split.push_back(t.clone());

  clip_grad_norm(whole, 1.f);

  // Two "stages" own the first two and the last two tensors; their partial sums are added as an
  // allreduce would, then each applies the common factor.
  std::span<Tensor> stage0(split.data(), 2), stage1(split.data() + 2, 2);
  double total = sum_of_squares(std::span<const Tensor>(stage0.data(), 2)) +
                 sum_of_squares(std::span<const Tensor>(stage1.data(), 2));
  float f = clip_factor(std::sqrt(total), 1.0);
  CHECK(f < 1.f);
  scale(stage0, f);
  scale(stage1, f);
  for (std::size_t i = 0; i < whole.size(); ++i)
    CHECK(whole[i].to_vector() == split[i].to_vector());
}

TEST_CASE("clip_factor edge cases") {
  CHECK(clip_factor(0.0, 1.0) == 1.f);
  CHECK(clip_factor(4.0, 1.0) == doctest::Approx(0.25));
  CHECK(clip_factor(std::numeric_limits<double>::quiet_NaN(), 1.0) == 1.f);
  CHECK(clip_factor(std::numeric_limits<double>::infinity(), 1.0) == 1.f);
  CHECK_THROWS_AS(clip_factor(1.0, 0.0), ConfigError);
  std::vector<Tensor> none;
  CHECK(clip_grad_norm(none, 1.f) == 0.0);
}

}  // namespace test_grad_clip
