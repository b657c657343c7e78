// The jump-ahead that lets the CUDA dropout kernel reproduce the CPU's mask (kernels/
// xoshiro_jump.cuh, plain C++ outside nvcc): seeding and stepping equal pipeline::Rng, a jump of
// k · 1024 draws lands where k · 1024 serial draws do, jumps compose, and a mask built the way the
// kernel builds it (per 1024-draw block, from a jumped state) is ops::dropout_mask bit for bit.
#include <pipeline/core/rng.hpp>
#include <pipeline/ops/dropout.hpp>

#include "../../kernels/xoshiro_jump.cuh"

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

namespace test_xoshiro_jump {

using namespace pipeline;
namespace xo = pipeline::kernels::xoshiro;

namespace {
bool same(const xo::State& a, const xo::State& b) {
  return a.s[0] == b.s[0] && a.s[1] == b.s[1] && a.s[2] == b.s[2] && a.s[3] == b.s[3];
}
}  // namespace

TEST_CASE("xoshiro jump-ahead reproduces pipeline::Rng's stream") {
  const std::vector<std::uint64_t> tables = xo::jump_table();
  REQUIRE(tables.size() == static_cast<std::size_t>(xo::kLevels) * xo::kWordsPerMatrix);
  const std::uint64_t seed = 2024;
  const char* key = "blocks.0.mlp_dropout";
  Rng rng(seed, key);
  const xo::State start = xo::seeded(seed ^ Rng::hash(key));

  const std::int64_t draws = 2100 * xo::kJump;
  std::vector<std::uint64_t> serial(static_cast<std::size_t>(draws));
  for (auto& d : serial) d = rng.next_u64();
  xo::State st = start;
  for (int i = 0; i < 100; ++i) CHECK(xo::next(st) == serial[static_cast<std::size_t>(i)]);

  for (std::uint64_t k : {0u, 1u, 2u, 3u, 5u, 64u, 1000u, 1023u, 1024u, 2047u, 2099u}) {
    CAPTURE(k);
    xo::State j = xo::jump(tables.data(), start, k);
    for (std::uint64_t i = 0; i < 3; ++i)
      CHECK(xo::next(j) == serial[static_cast<std::size_t>(k * xo::kJump + i)]);
  }
  // Far jumps (every level) compose as additions of their distances.
  CHECK(same(xo::jump(tables.data(), xo::jump(tables.data(), start, 123456789), 987654321),
             xo::jump(tables.data(), start, 123456789 + 987654321)));
  CHECK(same(xo::jump(tables.data(), xo::jump(tables.data(), start, 1ull << 30), 1ull << 30),
             xo::jump(tables.data(), start, 1ull << 31)));
}

TEST_CASE("a mask drawn per 1024-draw block from jumped states is ops::dropout_mask") {
  const std::vector<std::uint64_t> tables = xo::jump_table();
  for (std::int64_t n : {1, 1023, 1024, 1025, 100003}) {
    CAPTURE(n);
    const float p = 0.35f, keep = 1.f / (1.f - p);
    const Tensor ref = ops::dropout_mask(Shape{n}, p, 99, "fc");
    const xo::State start = xo::seeded(99 ^ Rng::hash("fc"));
    std::vector<float> mask(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k * xo::kJump < n; ++k) {
      xo::State st = xo::jump(tables.data(), start, static_cast<std::uint64_t>(k));
      for (std::int64_t i = k * xo::kJump; i < std::min(n, (k + 1) * xo::kJump); ++i)
        mask[static_cast<std::size_t>(i)] = xo::uniform(st) < p ? 0.f : keep;
    }
    CHECK(mask == ref.to_vector());
  }
}

}  // namespace test_xoshiro_jump
