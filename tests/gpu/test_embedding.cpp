// CUDA embedding against the CPU op: the lookup (exact: a copy), the gradient's scatter-add (bit
// for bit: runs of equal ids are added in increasing position, as the CPU adds them), heavy
// repetition of a few ids, an empty batch, a bad id (the CPU's error, nothing written), and the
// learned positions' add and gradient.
#include <pipeline/ops/embedding.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

namespace test_embedding {

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {
struct Case {
  std::int64_t vocab, dim, batch, steps;
};
constexpr Case kCases[] = {{1, 1, 1, 1},        {7, 7, 3, 11},      {1000, 64, 4, 33},
                           {50257, 300, 2, 50}, {3, 129, 7, 14287}, {256, 1, 0, 16},
                           {97, 1000, 1, 1}};
}  // namespace

TEST_CASE("embedding forward and backward on CUDA match the CPU bit for bit") {
  for (const Case c : kCases) {
    CAPTURE(c.vocab);
    CAPTURE(c.dim);
    CAPTURE(c.batch);
    CAPTURE(c.steps);
    const auto seed = static_cast<std::uint64_t>(c.vocab * 31 + c.dim * 7 + c.batch + c.steps);
    const Shape id_shape{c.batch, c.steps}, out_shape{c.batch, c.steps, c.dim};
    const Tensor ids = random_ints(id_shape, seed, static_cast<std::int32_t>(c.vocab));
    const Tensor table = random_tensor(Shape{c.vocab, c.dim}, seed + 1);
    const Tensor ids_g = ids.to(kGpu);

    Tensor out = Tensor::empty(out_shape);
    ops::embedding_forward(ids, table, out);
    Tensor out_g = poisoned(out_shape);
    ops::embedding_forward(ids_g, table.to(kGpu), out_g);
    expect_equal("lookup", out, out_g);

    const Tensor dout = random_tensor(out_shape, seed + 2);
    const Tensor dtable0 = random_tensor(Shape{c.vocab, c.dim}, seed + 3);
    Tensor dtable = dtable0.clone();
    ops::embedding_backward(ids, dout, dtable);
    Tensor dtable_g = dtable0.to(kGpu);
    ops::embedding_backward(ids_g, dout.to(kGpu), dtable_g);
    expect_equal("table gradient", dtable, dtable_g);
  }
}

TEST_CASE("embedding on CUDA: a bad id is the CPU's error and nothing is written") {
  Tensor ids = random_ints(Shape{2, 9}, 1, 10);
  ids.data<std::int32_t>()[5] = 10;
  ids.data<std::int32_t>()[12] = -3;
  const Tensor table = random_tensor(Shape{10, 4}, 2).to(kGpu);
  Tensor out = Tensor::full(Shape{2, 9, 4}, 9.f, kGpu);
  CHECK_THROWS_WITH_AS(ops::embedding_forward(ids.to(kGpu), table, out),
                       doctest::Contains("id 10 at flat position 5 of ids [2, 9]"), Error);
  expect_equal("untouched output", Tensor::full(Shape{2, 9, 4}, 9.f), out);
  Tensor dtable = Tensor::full(Shape{10, 4}, 9.f, kGpu);
  CHECK_THROWS_WITH_AS(ops::embedding_backward(ids.to(kGpu), out, dtable),
                       doctest::Contains("id 10 at flat position 5"), Error);
  expect_equal("untouched gradient", Tensor::full(Shape{10, 4}, 9.f), dtable);
  CHECK_THROWS_WITH_AS(ops::embedding_forward(ids, table, out),
                       doctest::Contains("embedding_forward: its tensors are on"), ConfigError);
}

TEST_CASE("learned positions on CUDA: add exactly, gradient within float rounding") {
  for (const Case c : kCases) {
    if (c.batch == 0) continue;
    CAPTURE(c.batch);
    CAPTURE(c.steps);
    CAPTURE(c.dim);
    const auto seed = static_cast<std::uint64_t>(c.dim * 13 + c.steps);
    const Shape shape{c.batch, c.steps, c.dim};
    const Tensor pos = random_tensor(Shape{c.steps + 3, c.dim}, seed);  // more rows than steps
    const Tensor x = random_tensor(shape, seed + 1);
    Tensor y = x.clone();
    ops::add_positions(y, c.steps, pos);
    Tensor y_g = x.to(kGpu);
    ops::add_positions(y_g, c.steps, pos.to(kGpu));
    expect_equal("add_positions", y, y_g);

    const Tensor dpos0 = random_tensor(Shape{c.steps + 3, c.dim}, seed + 2);
    Tensor dpos = dpos0.clone();
    ops::positions_grad(x, c.steps, dpos);
    Tensor dpos_g = dpos0.to(kGpu);
    ops::positions_grad(x.to(kGpu), c.steps, dpos_g);
    expect_close("positions_grad", dpos, dpos_g, 1e-4);
  }
}

}  // namespace test_embedding
