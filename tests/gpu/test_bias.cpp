// CUDA bias add and bias gradient against the CPU op: odd row and feature counts (not multiples
// of the 32-column blocks), one and many row chunks of the two-pass gradient, an empty batch.
#include <pipeline/ops/bias.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

namespace test_bias {

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {
struct Case {
  std::int64_t rows, features;
};
constexpr Case kCases[] = {{0, 5},   {1, 1},      {7, 3},       {1, 1000},   {33, 1000}, {1000, 7},
                           {65, 33}, {4097, 129}, {1000003, 1}, {20000, 64}, {3, 70000}};
}  // namespace

TEST_CASE("add_bias on CUDA matches the CPU exactly") {
  for (const Case c : kCases) {
    CAPTURE(c.rows);
    CAPTURE(c.features);
    const auto seed = static_cast<std::uint64_t>(c.rows * 131 + c.features);
    const Tensor y0 = random_tensor(Shape{c.rows, c.features}, seed);
    const Tensor bias = random_tensor(Shape{c.features}, seed + 1);
    Tensor y_cpu = y0.clone();
    ops::add_bias(y_cpu, bias);
    Tensor y_gpu = y0.to(kGpu);
    ops::add_bias(y_gpu, bias.to(kGpu));
    // One float addition per element on either side.
    expect_equal("add_bias", y_cpu, y_gpu);
  }
}

TEST_CASE("bias_grad on CUDA matches the CPU and accumulates") {
  for (const Case c : kCases) {
    CAPTURE(c.rows);
    CAPTURE(c.features);
    const auto seed = static_cast<std::uint64_t>(c.rows * 137 + c.features);
    const Tensor dy = random_tensor(Shape{c.rows, c.features}, seed);
    const Tensor db0 = random_tensor(Shape{c.features}, seed + 1);
    Tensor db_cpu = db0.clone();
    ops::bias_grad(dy, db_cpu);
    Tensor db_gpu = db0.to(kGpu);
    ops::bias_grad(dy.to(kGpu), db_gpu);
    expect_close("bias_grad", db_cpu, db_gpu, 1e-4);
    // The same input gives the same bits again (the reduction order is fixed).
    Tensor again = db0.to(kGpu);
    ops::bias_grad(dy.to(kGpu), again);
    expect_equal("bias_grad repeated", host(db_gpu), again);
  }
}

TEST_CASE("bias ops given tensors on two devices name both") {
  Tensor yg = random_tensor(Shape{2, 3}, 1).to(kGpu);
  CHECK_THROWS_WITH_AS(ops::add_bias(yg, random_tensor(Shape{3}, 2)),
                       doctest::Contains("add_bias: its tensors are on cuda:0 and cpu"),
                       ConfigError);
}

}  // namespace test_bias
