// CUDA fused attention against the CPU op: forward output, the saved log-sum-exp (against a
// double-precision reference) and the packed input gradient, causal and not, over sequence
// lengths on both sides of the 64- and 32-row tiles (1, 7, 64, 65, 257), head dims of the three
// compiled widths and between them (16, 48: zero-padded tails), several batches and head counts;
// gradients bitwise reproducible; the saved record is [B, H, T] and a T×T matrix is never
// allocated; the transformer block forward and backward on CUDA against the CPU.
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/nn/layers/transformer_block.hpp>
#include <pipeline/ops/attention.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace test_attention {

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {

struct Case {
  std::int64_t batch, steps, heads, head_dim;
};
constexpr Case kCases[] = {{1, 1, 1, 32},    {2, 7, 3, 32},   {1, 64, 2, 64},  {2, 65, 2, 64},
                           {1, 257, 2, 128}, {3, 65, 1, 128}, {2, 33, 4, 16},  {1, 100, 2, 48},
                           {2, 257, 1, 32},  {1, 7, 2, 128},  {1, 64, 1, 128}, {4, 1, 2, 64}};

// log Σ_{j visible} exp(q_i·k_j / √Dh) per (b, h, i), in double, from packed qkv.
std::vector<double> reference_lse(const Tensor& qkv, const Case& c, bool causal) {
  const std::int64_t C = c.heads * c.head_dim, T = c.steps;
  const float* p = qkv.data<float>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::vector<double> lse;
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t n = causal ? i + 1 : T;
        std::vector<double> s(static_cast<std::size_t>(n));
        double m = -INFINITY;
        for (std::int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < c.head_dim; ++d)
            dot += static_cast<double>(p[(b * T + i) * 3 * C + h * c.head_dim + d]) *
                   p[(b * T + j) * 3 * C + C + h * c.head_dim + d];
          s[static_cast<std::size_t>(j)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        lse.push_back(m + std::log(sum));
      }
  return lse;
}

}  // namespace

TEST_CASE("fused attention on CUDA matches the CPU op, forward and backward") {
  for (const Case c : kCases) {
    for (const bool causal : {true, false}) {
      CAPTURE(c.batch);
      CAPTURE(c.steps);
      CAPTURE(c.heads);
      CAPTURE(c.head_dim);
      CAPTURE(causal);
      const std::int64_t B = c.batch, T = c.steps, H = c.heads, C = H * c.head_dim;
      const auto seed = static_cast<std::uint64_t>(B * 1000003 + T * 1009 + H * 31 + c.head_dim);
      const Shape io{B, T, C}, packed{B, T, 3 * C};
      // Scores of a few units: softmax rows neither uniform nor one-hot.
      const Tensor qkv = random_tensor(packed, seed, -2.f, 2.f);
      const Tensor dout = random_tensor(io, seed + 1);

      Tensor out_cpu = Tensor::empty(io);
      Tensor probs = Tensor::empty(ops::attention_saved_shape(Device::cpu(), B, H, T));
      ops::attention_forward_packed(qkv, H, out_cpu, probs, causal);
      Tensor dqkv_cpu = Tensor::empty(packed);
      ops::attention_backward_packed(qkv, out_cpu, probs, dout, H, dqkv_cpu, causal);

      const Tensor qkv_gpu = qkv.to(kGpu), dout_gpu = dout.to(kGpu);
      const Shape saved_shape = ops::attention_saved_shape(kGpu, B, H, T);
      CHECK(saved_shape == Shape{B, H, T});
      Tensor out_gpu = poisoned(io), lse = poisoned(saved_shape);
      ops::attention_forward_packed(qkv_gpu, H, out_gpu, lse, causal);
      expect_close("attention forward", out_cpu, out_gpu, 1e-4);

      const std::vector<double> want = reference_lse(qkv, c, causal);
      const Tensor lse_host = host(lse);
      Tensor lse_want = Tensor::empty(saved_shape);
      for (std::size_t i = 0; i < want.size(); ++i)
        lse_want.data<float>()[i] = static_cast<float>(want[i]);
      expect_close("attention log-sum-exp", lse_want, lse_host, 1e-5);

      Tensor dqkv_gpu = poisoned(packed);
      ops::attention_backward_packed(qkv_gpu, out_gpu, lse, dout_gpu, H, dqkv_gpu, causal);
      expect_close("attention backward dqkv", dqkv_cpu, dqkv_gpu, 1e-4);

      // No atomics: the same inputs give the same bits.
      Tensor again = poisoned(packed);
      ops::attention_backward_packed(qkv_gpu, out_gpu, lse, dout_gpu, H, again, causal);
      expect_equal("attention backward repeated", host(dqkv_gpu), again);
    }
  }
}

TEST_CASE("fused attention on CUDA: separate q, k, v tensors as the packed form") {
  const std::int64_t B = 2, T = 65, H = 2, D = 64, C = H * D;
  const Shape s{B, T, C};
  const Tensor q = random_tensor(s, 41, -2.f, 2.f), k = random_tensor(s, 42, -2.f, 2.f),
               v = random_tensor(s, 43), dout = random_tensor(s, 44);
  Tensor out_cpu = Tensor::empty(s), probs = Tensor::empty({B, H, T, T});
  ops::attention_forward(q, k, v, H, out_cpu, probs);
  Tensor dq = Tensor::empty(s), dk = Tensor::empty(s), dv = Tensor::empty(s);
  ops::attention_backward(q, k, v, out_cpu, probs, dout, H, dq, dk, dv);

  const Tensor qg = q.to(kGpu), kg = k.to(kGpu), vg = v.to(kGpu), dg = dout.to(kGpu);
  Tensor out = poisoned(s), lse = poisoned({B, H, T});
  ops::attention_forward(qg, kg, vg, H, out, lse);
  expect_close("attention forward (separate)", out_cpu, out, 1e-4);
  Tensor dqg = poisoned(s), dkg = poisoned(s), dvg = poisoned(s);
  ops::attention_backward(qg, kg, vg, out, lse, dg, H, dqg, dkg, dvg);
  expect_close("attention dq", dq, dqg, 1e-4);
  expect_close("attention dk", dk, dkg, 1e-4);
  expect_close("attention dv", dv, dvg, 1e-4);
}

TEST_CASE("fused attention on CUDA never allocates the T x T matrix") {
  // Probabilities of one [1, 8, 2048, 2048] call would be 128 MiB; everything the op needs
  // (qkv 12 MiB, out 4 MiB, lse 64 KiB, the gradient 12 MiB) is a fraction of that.
  const std::int64_t B = 1, T = 2048, H = 8, D = 64, C = H * D;
  const Tensor qkv = random_tensor({B, T, 3 * C}, 51).to(kGpu);
  const Tensor dout = random_tensor({B, T, C}, 52).to(kGpu);
  Tensor out = Tensor::empty({B, T, C}, DType::Float32, kGpu);
  Tensor lse = Tensor::empty(ops::attention_saved_shape(kGpu, B, H, T), DType::Float32, kGpu);
  Tensor dqkv = Tensor::empty({B, T, 3 * C}, DType::Float32, kGpu);
  // Everything the op is given is allocated by now, and this file's earlier cases peaked far
  // lower (their largest tensor is under 1 MiB), so the peak from here on is the op's own.
  const std::int64_t before = cuda::device_memory_stats(0).in_use_bytes;
  ops::attention_forward_packed(qkv, H, out, lse);
  ops::attention_backward_packed(qkv, out, lse, dout, H, dqkv);
  const auto after = cuda::device_memory_stats(0);
  CHECK(after.in_use_bytes == before);  // its scratch (the row dots, B·H·T floats) is released
  const std::int64_t probs_bytes = static_cast<std::int64_t>(sizeof(float)) * B * H * T * T;
  CHECK(after.peak_in_use_bytes - before < probs_bytes / 64);
  // Finite output: no row lost its normaliser.
  const Tensor o = host(out);
  bool finite = true;
  for (float x : o.values()) finite = finite && std::isfinite(x);
  CHECK(finite);
}

TEST_CASE("fused attention on CUDA: errors name the problem") {
  const Tensor qkv = random_tensor({1, 3, 6}, 61).to(kGpu);
  Tensor out_cpu = Tensor::empty({1, 3, 2});
  Tensor lse = Tensor::empty({1, 1, 3}, DType::Float32, kGpu);
  CHECK_THROWS_WITH_AS(ops::attention_forward_packed(qkv, 1, out_cpu, lse),
                       doctest::Contains("attention_forward_packed: its tensors are on cuda:0 and "
                                         "cpu"),
                       ConfigError);
  // The CPU's [B, H, T, T] record is not what the CUDA path keeps.
  Tensor out = Tensor::empty({1, 3, 2}, DType::Float32, kGpu);
  Tensor probs = Tensor::empty({1, 1, 3, 3}, DType::Float32, kGpu);
  CHECK_THROWS_AS(ops::attention_forward_packed(qkv, 1, out, probs), Error);
  // Head dim 129 is beyond the kernels' widths.
  const Tensor wide = random_tensor({1, 3, 3 * 129}, 62).to(kGpu);
  Tensor wide_out = Tensor::empty({1, 3, 129}, DType::Float32, kGpu);
  CHECK_THROWS_WITH_AS(ops::attention_forward_packed(wide, 1, wide_out, lse),
                       doctest::Contains("head dim 129"), ConfigError);
}

TEST_CASE("the transformer block on CUDA matches the CPU, forward and backward") {
  struct BlockCase {
    std::int64_t batch, steps, dim, heads;
    float dropout;
  };
  for (const BlockCase c : {BlockCase{2, 7, 64, 2, 0.f}, BlockCase{1, 65, 128, 4, 0.1f},
                            BlockCase{3, 33, 96, 2, 0.f}, BlockCase{1, 20, 256, 2, 0.f}}) {
    CAPTURE(c.steps);
    CAPTURE(c.dim);
    CAPTURE(c.heads);
    CAPTURE(c.dropout);
    const TransformerBlock blk("blk", c.dim, c.heads, 4, c.dropout);
    LayerParams p_cpu = blk.init(71);
    LayerParams p_gpu;
    for (const Tensor& t : p_cpu.params) p_gpu.params.push_back(t.to(kGpu));
    const Shape xs{c.batch, c.steps, c.dim};
    const Tensor x = random_tensor(xs, 72);
    const Tensor dy = random_tensor(xs, 73);
    const ForwardContext ctx{Mode::Train, 9};

    Saved s_cpu, s_gpu;
    const Tensor y_cpu = blk.forward(p_cpu, x, s_cpu, ctx);
    const Tensor y_gpu = blk.forward(p_gpu, x.to(kGpu), s_gpu, ctx);
    expect_close("block forward", y_cpu, y_gpu, 1e-4);
    // The attention record on the GPU is [B, H, T].
    REQUIRE(s_gpu.tensors.size() >= 3);
    CHECK(s_gpu.tensors[2].shape() == Shape{c.batch, c.heads, c.steps});

    std::vector<Tensor> g_cpu = blk.zero_grads(), g_gpu = blk.zero_grads(kGpu);
    const Tensor dx_cpu = blk.backward(p_cpu, s_cpu, dy, g_cpu);
    const Tensor dx_gpu = blk.backward(p_gpu, s_gpu, dy.to(kGpu), g_gpu);
    expect_close("block dx", dx_cpu, dx_gpu, 1e-4);
    const auto specs = blk.parameters();
    for (std::size_t k = 0; k < g_cpu.size(); ++k)
      expect_close("block grad " + specs[k].name, g_cpu[k], g_gpu[k], 1e-4);
  }
}

}  // namespace test_attention
