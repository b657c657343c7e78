// bf16 mixed precision on CUDA against the CPU's (ops/precision.hpp): the rounding kernel bit for
// bit; gemm (cuBLASLt) and convolutions (cuDNN's graph API, and its legacy path: five geometries)
// on the bf16 tensor cores and the rounded-operand attention against the CPU's rounded operands
// with float32 accumulation, on odd and large sizes, outputs poisoned; stashed bf16 weights read
// as they are; transformer-lm trained in bf16 on the GPU tracks float32 (loss within 2% after 200
// steps) and its 1F1B-stash weights stashed in bf16 equal those stashed in float32.
#include <pipeline/cuda/dnn_graph.hpp>
#include <pipeline/nn/layers/conv2d.hpp>
#include <pipeline/nn/layers/residual_block.hpp>
#include <pipeline/nn/layers/transformer_block.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/ops/attention.hpp>
#include <pipeline/ops/conv.hpp>
#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/gemm.hpp>
#include <pipeline/ops/precision.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/runtime/in_process.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "gpu_compare.hpp"
#include "support/widened_records.hpp"

namespace test_precision {

using namespace pipeline;
using pipeline::testing::widened;
using namespace pipeline::gpu_test;

TEST_CASE("round_to_bf16 on CUDA equals the CPU bit for bit") {
  for (const std::int64_t n : {1, 7, 33, 1000, (1 << 20) + 3}) {
    CAPTURE(n);
    const Tensor x = random_tensor(Shape{n}, 1 + static_cast<std::uint64_t>(n), -1e3f, 1e3f);
    expect_equal("round_to_bf16", ops::round_to_bf16(x), ops::round_to_bf16(x.to(kGpu)));
  }
}

TEST_CASE("gemm under bf16: the tensor cores against the CPU's rounded operands") {
  struct Dims {
    std::int64_t m, n, k;
  };
  for (const Dims d : {Dims{1, 1, 1}, Dims{7, 5, 33}, Dims{257, 33, 511}, Dims{1000, 768, 1024}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const Tensor a = random_tensor(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, 10 + t);
      const Tensor b = random_tensor(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, 20 + t);
      const Tensor c0 = random_tensor(Shape{d.m, d.n}, 30 + t);
      for (const float beta : {0.f, 1.f}) {
        CAPTURE(d.m);
        CAPTURE(d.k);
        CAPTURE(t);
        CAPTURE(beta);
        Tensor want = c0.clone();
        Tensor got = beta == 0.f ? poisoned(Shape{d.m, d.n}) : c0.to(kGpu);
        const ops::ComputeDTypeScope bf16(DType::BFloat16);
        ops::gemm(a, ta, b, tb, want, 0.5f, beta);
        ops::gemm(a.to(kGpu), ta, b.to(kGpu), tb, got, 0.5f, beta);
        expect_close("gemm bf16", want, got, 1e-5);
        // A weight stashed in bf16 on the device.
        Tensor from16 = beta == 0.f ? poisoned(Shape{d.m, d.n}) : c0.to(kGpu);
        ops::gemm(a.to(kGpu), ta, ops::to_dtype(b.to(kGpu), DType::BFloat16), tb, from16, 0.5f,
                  beta);
        expect_close("gemm bf16 operand", want, from16, 1e-5);
      }
    }
  }
}

TEST_CASE("convolutions and attention under bf16 on CUDA equal the CPU's") {
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  struct Conv {
    Shape x;
    std::int64_t out, kernel, stride, pad;
  };
  // 3x3 (vgg16's), 5x5 over one channel (fashion-cnn's conv1), strided with a ragged border,
  // 1x1 (resnet18's shortcut), a wide 3x3 whose operands are 16-byte aligned.
  const Conv convs[] = {{{3, 5, 13, 11}, 7, 3, 1, 1},
                        {{4, 1, 28, 28}, 32, 5, 1, 2},
                        {{2, 6, 15, 17}, 9, 3, 2, 1},
                        {{3, 8, 9, 9}, 16, 1, 2, 0},
                        {{8, 64, 16, 16}, 64, 3, 1, 1}};
  const RestoreGraphConvolutions restore;
  for (const bool graph : {true, false}) {  // cuDNN's graph API, and the legacy path
    cuda::set_graph_convolutions(graph ? cuda::GraphConvolutions::Bf16
                                       : cuda::GraphConvolutions::None);
    for (std::size_t i = 0; i < std::size(convs); ++i) {
      const Conv& c = convs[i];
      CAPTURE(graph);
      CAPTURE(i);
      const ops::Window2d w = ops::Window2d::square(c.kernel, c.stride, c.pad);
      const Tensor x = random_tensor(c.x, 1 + i);
      const Tensor weight = random_tensor({c.out, c.x[1], c.kernel, c.kernel}, 2 + i);
      const Tensor bias = random_tensor({c.out}, 3 + i);
      const Shape ys = ops::conv2d_output_shape(x.shape(), weight.shape(), w);
      const Tensor dy = random_tensor(ys, 4 + i);
      Tensor y = Tensor::empty(ys), dx = Tensor::empty(x.shape());
      Tensor dw = random_tensor(weight.shape(), 5 + i);
      Tensor yg = poisoned(ys), dxg = poisoned(dx.shape()), dwg = dw.to(kGpu);
      ops::conv2d_forward(x, weight, bias, y, w);
      ops::conv2d_backward_data(dy, weight, dx, w);
      ops::conv2d_backward_filter(x, dy, dw, w);
      // The weight as a version stashed in bf16 on the device: read as it is.
      const Tensor weight16 = ops::to_dtype(weight.to(kGpu), DType::BFloat16);
      ops::conv2d_forward(x.to(kGpu), weight16, bias.to(kGpu), yg, w);
      ops::conv2d_backward_data(dy.to(kGpu), weight16, dxg, w);
      ops::conv2d_backward_filter(x.to(kGpu), dy.to(kGpu), dwg, w);
      // cuDNN accumulates in another order before it rounds to bf16: an element may land one bf16
      // step (2^-8 relative) away.
      expect_close("conv2d_forward bf16", y, yg, 1e-2);
      expect_close("conv2d_backward_data bf16", dx, dxg, 1e-2);
      expect_close("conv2d_backward_filter bf16", dw, dwg, 1e-2);
      // The input and output gradient already in bf16 (what a Conv2d keeps and converts once
      // under a bf16 compute dtype): the same values go to the same deterministic algorithms, so
      // the same bits as from their float32 copies.
      const Tensor x16 = ops::to_dtype(x.to(kGpu), DType::BFloat16);
      const Tensor dy16 = ops::to_dtype(dy.to(kGpu), DType::BFloat16);
      Tensor yg16 = poisoned(ys), dxg16 = poisoned(dx.shape());
      Tensor dwg16 = random_tensor(weight.shape(), 5 + i).to(kGpu);
      ops::conv2d_forward(x16, weight16, bias.to(kGpu), yg16, w);
      ops::conv2d_backward_data(dy16, weight16, dxg16, w);
      ops::conv2d_backward_filter(x16, dy16, dwg16, w);
      expect_equal("conv2d_forward, bf16 input", host(yg), yg16);
      // The bias is added to the rounded product exactly (one float add: with the widening in
      // one kernel on the graph path, four at a time where a plane is a multiple of 4).
      Tensor yg_nb = poisoned(ys);
      ops::conv2d_forward(x16, weight16, Tensor(), yg_nb, w);
      const Tensor y_nb = host(yg_nb);
      Tensor want_biased = Tensor::empty(ys);
      const std::int64_t plane = ys[2] * ys[3];
      for (std::int64_t e = 0; e < want_biased.numel(); ++e)
        want_biased.data<float>()[e] =
            y_nb.data<float>()[e] + bias.data<float>()[(e / plane) % c.out];
      expect_equal("conv2d_forward bias after the rounding", want_biased, yg);
      expect_equal("conv2d_backward_data, bf16 gradient", host(dxg), dxg16);
      expect_equal("conv2d_backward_filter, bf16 input and gradient", host(dwg), dwg16);
    }
  }

  const std::int64_t B = 2, T = 33, C = 64, H = 4;
  const Tensor qkv = random_tensor({B, T, 3 * C}, 6), dout = random_tensor({B, T, C}, 7);
  Tensor out = Tensor::empty({B, T, C}), dqkv = Tensor::empty({B, T, 3 * C});
  Tensor saved = Tensor::empty(ops::attention_saved_shape(Device::cpu(), B, H, T));
  ops::attention_forward_packed(qkv, H, out, saved);
  ops::attention_backward_packed(qkv, out, saved, dout, H, dqkv);
  Tensor outg = poisoned(out.shape()), dqkvg = poisoned(dqkv.shape());
  Tensor savedg = poisoned(ops::attention_saved_shape(kGpu, B, H, T));
  const Tensor qkvg = qkv.to(kGpu);
  ops::attention_forward_packed(qkvg, H, outg, savedg);
  ops::attention_backward_packed(qkvg, outg, savedg, dout.to(kGpu), H, dqkvg);
  expect_close("attention forward bf16", out, outg, 1e-4);
  expect_close("attention backward bf16", dqkv, dqkvg, 1e-4);
}

namespace {

// What `layer` computes under bf16 on the GPU: its output, then for each of the whole, input and
// weight passes the input gradient and the weight gradients, once from what the layer kept
// (inputs of its products in bf16) and once from the same records widened, which must give the
// same bits; everything within bf16's rounding of the CPU under bf16.
void check_layer_under_bf16(const Layer& layer, const Shape& x_shape, std::uint64_t seed) {
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  const Tensor x = random_tensor(x_shape, seed);
  LayerParams p = layer.init(seed + 1);
  LayerParams pg = p.to(kGpu);
  Saved saved, saved_g;
  const ForwardContext ctx;
  const Tensor y = layer.forward(p, x, saved, ctx);
  const Tensor yg = layer.forward(pg, x.to(kGpu), saved_g, ctx);
  expect_close("forward", y, yg, 1e-2);
  const Tensor dy = random_tensor(y.shape(), seed + 2);
  const Saved wide_g = widened(saved_g);
  for (const GradParts parts : {GradParts::Both, GradParts::Input, GradParts::Weight}) {
    CAPTURE(static_cast<int>(parts));
    std::vector<Tensor> g = layer.zero_grads(), gg = layer.zero_grads(kGpu),
                        gw = layer.zero_grads(kGpu);
    const Tensor dx = layer.backward(p, saved, dy, g, parts);
    const Tensor dxg = layer.backward(pg, saved_g, dy.to(kGpu), gg, parts);
    const Tensor dxw = layer.backward(pg, wide_g, dy.to(kGpu), gw, parts);
    if (parts != GradParts::Weight) {
      expect_close("input gradient", dx, dxg, 1e-2);
      expect_equal("input gradient from widened records", host(dxw), dxg);
    }
    for (std::size_t i = 0; i < g.size(); ++i) {
      CAPTURE(i);
      expect_close("weight gradient", g[i], gg[i], 1e-2);
      expect_equal("weight gradient from widened records", host(gw[i]), gg[i]);
    }
  }
}

}  // namespace

// A Conv2d, a residual block whose conv1 and downsampling conv read one bf16 copy of x, and a
// transformer block whose layer norms, GELU and qkv product write bf16 (head widths 32, 20, 10:
// the bf16 qkv read as it is, zero-filled past its width, and widened), under bf16 on the GPU.
TEST_CASE("layers under bf16 on CUDA: bf16 records give the widened records' bits, near the CPU") {
  const RestoreGraphConvolutions restore;
  for (const bool graph : {true, false}) {  // cuDNN's graph API, and the legacy path
    CAPTURE(graph);
    cuda::set_graph_convolutions(graph ? cuda::GraphConvolutions::Bf16
                                       : cuda::GraphConvolutions::None);
    check_layer_under_bf16(Conv2d("conv", 3, 4, 3, 1, 1), Shape{2, 3, 9, 7}, 81);
    check_layer_under_bf16(ResidualBlock("block", 4, 8, 2), Shape{2, 4, 8, 8}, 91);
  }
  struct Block {
    std::int64_t dim, heads, steps;
  };
  for (const Block b : {Block{64, 2, 7}, Block{60, 3, 65}, Block{30, 3, 7}, Block{45, 3, 65}}) {
    CAPTURE(b.dim);
    CAPTURE(b.heads);
    CAPTURE(b.steps);
    check_layer_under_bf16(TransformerBlock("block", b.dim, b.heads), Shape{2, b.steps, b.dim},
                           101 + static_cast<std::uint64_t>(b.dim));
  }
}

// Every set of tensor-core kernels (ops::Bf16AttentionKernel; sm_80 and later, the float32 ones
// elsewhere): every padded head width (32, 64, 128), one and several 64-row tiles with ragged
// tails, causal and full, against the CPU on the same rounded operands; head widths that are not
// a multiple of 4 (30, 21) take the kernels' element-by-element loads.
TEST_CASE("attention on the bf16 tensor cores equals the CPU's on rounded operands") {
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  struct Case {
    std::int64_t batch, steps, channels, heads;
    bool causal;
  };
  struct RestoreKernel {
    ops::Bf16AttentionKernel was = ops::bf16_attention_kernel();
    ~RestoreKernel() { ops::set_bf16_attention_kernel(was); }
  } restore;
  const Case cases[] = {Case{1, 1, 64, 1, true},    Case{2, 200, 256, 4, true},
                        Case{1, 130, 256, 2, true}, Case{3, 77, 96, 3, false},
                        Case{2, 64, 128, 1, false}, Case{1, 1000, 64, 1, true},
                        Case{2, 70, 90, 3, true},   Case{1, 65, 21, 1, false},
                        Case{2, 70, 60, 3, true}};  // head width 20: 4-aligned, under its padding
  for (const auto kernel : {ops::Bf16AttentionKernel::Wmma, ops::Bf16AttentionKernel::Mma,
                            ops::Bf16AttentionKernel::MmaRounded})
    for (const Case c : cases) {
      ops::set_bf16_attention_kernel(kernel);
      const char* names[] = {"wmma", "mma", "mma-rounded"};
      CAPTURE(names[static_cast<int>(kernel)]);
      // P and dS rounded to bf16 (2^-9 relative each) instead of split: bf16's rounding, not
      // fp32's, separates the GPU from the CPU. A key's gradient sums up to `steps` rounded
      // terms (a random walk, ~sqrt(steps)) while the typical gradient that normalises the error
      // does not grow with the sequence: the first keys of a 1000-step causal sequence measured
      // 0.041 on an H200, the 200-step cases under 0.03.
      const double tol = kernel == ops::Bf16AttentionKernel::MmaRounded
                             ? 3e-2 * std::sqrt(std::max(1.0, static_cast<double>(c.steps) / 200))
                             : 1e-4;
      CAPTURE(c.batch);
      CAPTURE(c.steps);
      CAPTURE(c.channels);
      CAPTURE(c.heads);
      CAPTURE(c.causal);
      const Shape xs{c.batch, c.steps, c.channels};
      const auto seed = static_cast<std::uint64_t>(c.steps * 31 + c.channels);
      const Tensor q = random_tensor(xs, seed), k = random_tensor(xs, seed + 1),
                   v = random_tensor(xs, seed + 2), dout = random_tensor(xs, seed + 3);
      Tensor out = Tensor::empty(xs), dq = Tensor::empty(xs), dk = Tensor::empty(xs),
             dv = Tensor::empty(xs);
      Tensor saved =
          Tensor::empty(ops::attention_saved_shape(Device::cpu(), c.batch, c.heads, c.steps));
      ops::attention_forward(q, k, v, c.heads, out, saved, c.causal);
      ops::attention_backward(q, k, v, out, saved, dout, c.heads, dq, dk, dv, c.causal);

      Tensor outg = poisoned(xs), dqg = poisoned(xs), dkg = poisoned(xs), dvg = poisoned(xs);
      Tensor savedg = poisoned(ops::attention_saved_shape(kGpu, c.batch, c.heads, c.steps));
      const Tensor qg = q.to(kGpu), kg = k.to(kGpu), vg = v.to(kGpu);
      ops::attention_forward(qg, kg, vg, c.heads, outg, savedg, c.causal);
      ops::attention_backward(qg, kg, vg, outg, savedg, dout.to(kGpu), c.heads, dqg, dkg, dvg,
                              c.causal);
      expect_close("out", out, outg, tol);
      // One key: the softmax has no gradient, dq = dk = 0 exactly (dP − D cancels); the GPU's
      // dP (tensor cores) and D (a warp sum) round apart, so its ~1e-8 is measured against
      // the size of the cancelled terms, |dO|·|V|·|K|·√Dh·(1/√Dh), about 1 here.
      const double cancelled = c.steps == 1 ? 1.0 : 0.0;
      expect_close("dq", dq, dqg, tol, cancelled);
      expect_close("dk", dk, dkg, tol, cancelled);
      expect_close("dv", dv, dvg, tol);
    }
}

// A packed qkv held in bf16 is read as it is by the register-fragment kernels: the same bits as
// float32 holding the same values, forward and backward, head widths 20 and 100 (multiples of 4
// below the kernels' padded widths) among them; a head width that is not a multiple of 4 (30),
// and the WMMA kernels, widen it first, with the same result.
TEST_CASE("attention reads a packed qkv held in bf16 as the float32 one of the same values") {
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  struct RestoreKernel {
    ops::Bf16AttentionKernel was = ops::bf16_attention_kernel();
    ~RestoreKernel() { ops::set_bf16_attention_kernel(was); }
  } restore;
  struct Case {
    std::int64_t batch, steps, channels, heads;
    bool causal;
  };
  const Case cases[] = {Case{1, 1, 64, 2, true},    Case{2, 200, 256, 4, true},
                        Case{1, 130, 256, 2, true}, Case{2, 77, 96, 3, false},
                        Case{1, 100, 128, 1, true}, Case{2, 70, 90, 3, true},
                        Case{2, 70, 60, 3, true},     // head width 20: zero-filled past it
                        Case{1, 33, 300, 3, false}};  // head width 100 of a padded 128
  // The WMMA kernels widen a bf16 qkv first: the same values, the same bits.
  for (const auto kernel : {ops::Bf16AttentionKernel::Mma, ops::Bf16AttentionKernel::MmaRounded,
                            ops::Bf16AttentionKernel::Wmma})
    for (const Case c : cases) {
      ops::set_bf16_attention_kernel(kernel);
      CAPTURE(static_cast<int>(kernel));
      CAPTURE(c.steps);
      CAPTURE(c.channels);
      CAPTURE(c.heads);
      const Shape xs{c.batch, c.steps, c.channels}, packed{c.batch, c.steps, 3 * c.channels};
      const auto seed = static_cast<std::uint64_t>(c.steps * 17 + c.channels);
      const Tensor qkv16 = ops::to_dtype(random_tensor(packed, seed).to(kGpu), DType::BFloat16);
      const Tensor qkv32 = ops::to_dtype(qkv16, DType::Float32);
      const Tensor dout = random_tensor(xs, seed + 1).to(kGpu);
      const Shape ss = ops::attention_saved_shape(kGpu, c.batch, c.heads, c.steps);
      Tensor out32 = poisoned(xs), out16 = poisoned(xs), s32 = poisoned(ss), s16 = poisoned(ss);
      ops::attention_forward_packed(qkv32, c.heads, out32, s32, c.causal);
      ops::attention_forward_packed(qkv16, c.heads, out16, s16, c.causal);
      expect_equal("out", host(out32), out16);
      expect_equal("log-sum-exp", host(s32), s16);
      Tensor d32 = poisoned(packed), d16 = poisoned(packed);
      ops::attention_backward_packed(qkv32, out32, s32, dout, c.heads, d32, c.causal);
      ops::attention_backward_packed(qkv16, out16, s16, dout, c.heads, d16, c.causal);
      expect_equal("dqkv", host(d32), d16);
    }
}

namespace {

ZooModel small_lm() {
  ZooOptions zo;
  zo.vocab = 64;
  zo.seq_len = 32;
  zo.dim = 64;
  zo.heads = 4;
  zo.blocks = 2;
  return make_model("transformer-lm", zo);
}

// Batch j of a fixed cycle of 16 token batches.
Batch token_batch(std::int64_t j) {
  return gpu_test::token_batch(8, 32, 64, 500 + static_cast<std::uint64_t>(j % 16));
}

}  // namespace

TEST_CASE("transformer-lm in bf16 on CUDA tracks float32: loss within 2% after 200 steps") {
  const ZooModel zoo = small_lm();
  const ModelParams init = to_device(zoo.model.init(5), kGpu);
  auto adamw = [] { return std::make_unique<AdamW>(AdamWOptions{.weight_decay = 1e-2f}); };
  SequentialTrainer fp32(zoo.model, init, adamw(), 3, 1.f);
  SequentialTrainer bf16(zoo.model, clone_params(init), adamw(), 3, 1.f);
  double loss32 = 0, loss16 = 0, first = 0;
  for (std::int64_t step = 0; step < 200; ++step) {
    const Batch b = token_batch(step);
    loss32 = fp32.step(b, 3e-3f).loss;
    const ops::ComputeDTypeScope scope(DType::BFloat16);
    loss16 = bf16.step(b, 3e-3f).loss;
    if (step == 0) first = loss32;
  }
  MESSAGE("loss after 200 steps: float32 ", loss32, ", bf16 ", loss16, " (first ", first, ")");
  CHECK(loss32 < 0.9 * first);  // it learned
  CHECK(loss16 == doctest::Approx(loss32).epsilon(0.02));
}

TEST_CASE("1F1B-stash on one GPU under bf16: weights stashed in bf16 equal those in float32") {
  const ZooModel zoo = small_lm();
  const int layers = zoo.model.size();
  const PipelineLayout layout{{{0, layers / 2}, {layers / 2, layers}}, {{0}, {1}}};
  const Schedule s = generate_schedule("1f1b-stash", ScheduleSpec::straight(2, 1, 6));
  const MinibatchFeed feed{[](std::int64_t j) { return token_batch(j); },
                           [](std::int64_t) { return std::int64_t{8}; }};
  auto run = [&](bool bf16_stash) {
    std::vector<ModelParams> params(2);
    std::mutex m;
    run_in_process({.ranks = 2, .device = kGpu}, [&](Communicator& comm, Device d) {
      StageExecutor ex(
          zoo.model, zoo.sample_shape, zoo.input_dtype, layout, comm,
          std::make_unique<AdamW>(AdamWOptions{}),
          {.seed = 5, .device = d, .compute_dtype = DType::BFloat16, .bf16_stash = bf16_stash});
      ex.train(s, feed, 0, [](std::int64_t) { return 1e-3f; });
      std::lock_guard<std::mutex> lock(m);
      params[static_cast<std::size_t>(comm.rank())] = to_device(ex.params(), Device::cpu());
    });
    return params;
  };
  const auto narrow = run(true), wide = run(false);
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t l = 0; l < narrow[r].size(); ++l)
      for (std::size_t k = 0; k < narrow[r][l].params.size(); ++k)
        expect_equal("stashed in bf16 vs float32", wide[r][l].params[k], narrow[r][l].params[k]);
}

}  // namespace test_precision
