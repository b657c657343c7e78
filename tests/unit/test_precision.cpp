// bf16 mixed precision (ops/precision.hpp): the products read their operands rounded to bf16 and
// nothing else changes; bf16 operand tensors (stashed weights) are read exactly; weight versions
// stashed in bf16 change no result and take half the bytes; a pipeline under bf16 equals the
// single process under bf16.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/conv2d.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/layers/residual_block.hpp>
#include <pipeline/nn/layers/transformer_block.hpp>
#include <pipeline/ops/attention.hpp>
#include <pipeline/ops/conv.hpp>
#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/elementwise.hpp>
#include <pipeline/ops/gemm.hpp>
#include <pipeline/ops/precision.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/runtime/weight_store.hpp>
#include <pipeline/schedule/generator.hpp>

#include "../support/param_compare.hpp"
#include "../support/synthetic_minibatches.hpp"
#include "../support/widened_records.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace test_precision {

using namespace pipeline;
using pipeline::testing::max_rel_diff;
using pipeline::testing::widened;

namespace {

Tensor random(Shape s, std::uint64_t seed) {
  Tensor t = Tensor::empty(s);
  Rng(seed).fill_uniform(t, -1, 1);
  return t;
}

// The float32 tensor rounded to bf16 by the conversion ops (the reference of the rounding).
Tensor rounded(const Tensor& t) {
  return ops::to_dtype(ops::to_dtype(t, DType::BFloat16), DType::Float32);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  auto av = a.values(), bv = b.values();
  for (std::size_t i = 0; i < av.size(); ++i)
    worst = std::max(worst, std::abs(double(av[i]) - double(bv[i])));
  return worst;
}

}  // namespace

TEST_CASE("the compute dtype is float32 unless a scope sets it; scopes nest") {
  CHECK(ops::compute_dtype() == DType::Float32);
  {
    const ops::ComputeDTypeScope bf16(DType::BFloat16);
    CHECK(ops::compute_dtype() == DType::BFloat16);
    {
      const ops::ComputeDTypeScope fp32(DType::Float32);
      CHECK(ops::compute_dtype() == DType::Float32);
    }
    CHECK(ops::compute_dtype() == DType::BFloat16);
  }
  CHECK(ops::compute_dtype() == DType::Float32);
  CHECK_THROWS_WITH_AS(ops::ComputeDTypeScope{DType::Int32},
                       doctest::Contains("float32 or bfloat16, not int32"), ConfigError);
  CHECK(ops::parse_compute_dtype("bf16") == DType::BFloat16);
  CHECK(ops::parse_compute_dtype("float32") == DType::Float32);
  CHECK_THROWS_WITH_AS(ops::parse_compute_dtype("fp16"), doctest::Contains("use float32, or bf16"),
                       ConfigError);
}

TEST_CASE("round_to_bf16 equals the conversions there and back, on any size and thread count") {
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const std::int64_t n : {1, 7, 33, 1000, 300001}) {
      const Tensor x = random({n}, 11 + static_cast<std::uint64_t>(n));
      const Tensor r = ops::round_to_bf16(x);
      CAPTURE(n);
      CHECK(same_bits(r, rounded(x)));
      CHECK(r.raw() != x.raw());
    }
  }
  set_num_threads(1);
  CHECK_THROWS_WITH(ops::round_to_bf16(Tensor::zeros({3}, DType::Int32)),
                    doctest::Contains("needs float32 tensors"));
}

TEST_CASE("product_operand: the tensor itself in float32, rounded under bf16, widened from bf16") {
  const Tensor x = random({5, 9}, 3);
  CHECK(ops::product_operand(x).raw() == x.raw());
  const Tensor x16 = ops::to_dtype(x, DType::BFloat16);
  CHECK(same_bits(ops::product_operand(x16), rounded(x)));
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  CHECK(same_bits(ops::product_operand(x), rounded(x)));
  CHECK(same_bits(ops::product_operand(x16), rounded(x)));
}

TEST_CASE("gemm under bf16 equals the float32 gemm of the rounded operands") {
  const std::int64_t m = 7, k = 33, n = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 1.f}) {
        const Tensor a = ta ? random({k, m}, 1) : random({m, k}, 1);
        const Tensor b = tb ? random({n, k}, 2) : random({k, n}, 2);
        const Tensor c0 = random({m, n}, 3);
        Tensor want = c0.clone(), got = c0.clone(), full = c0.clone();
        ops::gemm(rounded(a), ta, rounded(b), tb, want, 0.5f, beta);
        ops::gemm(a, ta, b, tb, full, 0.5f, beta);
        {
          const ops::ComputeDTypeScope bf16(DType::BFloat16);
          ops::gemm(a, ta, b, tb, got, 0.5f, beta);
        }
        CAPTURE(ta);
        CAPTURE(tb);
        CHECK(same_bits(got, want));
        CHECK(max_abs_diff(got, full) > 1e-4);  // the rounding was applied
        // A bf16 operand tensor is read exactly, in either mode.
        Tensor from16 = c0.clone();
        ops::gemm(ops::to_dtype(a, DType::BFloat16), ta, rounded(b), tb, from16, 0.5f, beta);
        CHECK(same_bits(from16, want));
      }
}

TEST_CASE("convolutions under bf16: float32 ones of the rounded operands, results rounded") {
  // Few channels take the CPU's lowered convolution, 16 of them its Winograd transforms.
  struct Shape4 {
    std::int64_t c, m, h, w;
  };
  for (const Shape4 k : {Shape4{3, 4, 6, 5}, Shape4{16, 16, 8, 8}}) {
    CAPTURE(k.c);
    const std::int64_t C = k.c, M = k.m, P = k.h * k.w;
    const ops::Window2d w = ops::Window2d::square(3, 1, 1);
    const Tensor x = random({2, C, k.h, k.w}, 4), weight = random({M, C, 3, 3}, 5),
                 bias = random({M}, 6);
    const Tensor dy = random({2, M, k.h, k.w}, 7);
    struct Outputs {
      Tensor y, dx, dw;
    };
    const auto run = [&](const Tensor& xs, const Tensor& ws, const Tensor& dys) {
      Outputs o{Tensor::empty({2, M, k.h, k.w}), Tensor::empty({2, C, k.h, k.w}),
                random({M, C, 3, 3}, 8)};
      ops::conv2d_forward(xs, ws, bias, o.y, w);
      ops::conv2d_backward_data(dys, ws, o.dx, w);
      ops::conv2d_backward_filter(xs, dys, o.dw, w);  // accumulates
      return o;
    };
    // The reference: float32 passes on the rounded operands, their results rounded (y before the
    // bias, the weight gradient before it accumulates).
    Outputs want{Tensor::empty({2, M, k.h, k.w}), Tensor::empty({2, C, k.h, k.w}),
                 random({M, C, 3, 3}, 8)};
    ops::conv2d_forward(rounded(x), rounded(weight), Tensor(), want.y, w);
    want.y = rounded(want.y);
    for (std::int64_t s = 0; s < 2; ++s)
      for (std::int64_t c = 0; c < M; ++c)
        for (std::int64_t i = 0; i < P; ++i)
          want.y.data<float>()[(s * M + c) * P + i] += bias.data<float>()[c];
    ops::conv2d_backward_data(rounded(dy), rounded(weight), want.dx, w);
    want.dx = rounded(want.dx);
    Tensor part = Tensor::zeros({M, C, 3, 3});
    ops::conv2d_backward_filter(rounded(x), rounded(dy), part, w);
    ops::add_in_place(want.dw, rounded(part));
    const Outputs full = run(x, weight, dy);
    Outputs got, from16;
    {
      const ops::ComputeDTypeScope bf16(DType::BFloat16);
      got = run(x, weight, dy);
      from16 = run(x, ops::to_dtype(weight, DType::BFloat16), dy);  // a weight stashed in bf16
    }
    CHECK(same_bits(got.y, want.y));
    CHECK(same_bits(got.dx, want.dx));
    CHECK(same_bits(got.dw, want.dw));
    CHECK(max_abs_diff(got.y, full.y) > 1e-4);
    CHECK(same_bits(from16.y, want.y));
    CHECK(same_bits(from16.dx, want.dx));
  }
}

TEST_CASE("attention under bf16 equals the float32 attention of the rounded q, k, v and dout") {
  const std::int64_t B = 2, T = 7, C = 8, H = 2;
  const Tensor qkv = random({B, T, 3 * C}, 9), dout = random({B, T, C}, 10);
  const Shape saved_shape = ops::attention_saved_shape(Device::cpu(), B, H, T);
  const auto run = [&](const Tensor& q, const Tensor& d) {
    Tensor out = Tensor::empty({B, T, C}), saved = Tensor::empty(saved_shape);
    Tensor dqkv = Tensor::empty({B, T, 3 * C});
    ops::attention_forward_packed(q, H, out, saved);
    ops::attention_backward_packed(q, out, saved, d, H, dqkv);
    return std::pair{out, dqkv};
  };
  const auto want = run(rounded(qkv), rounded(dout));
  const auto full = run(qkv, dout);
  std::pair<Tensor, Tensor> got;
  {
    const ops::ComputeDTypeScope bf16(DType::BFloat16);
    got = run(qkv, dout);
  }
  CHECK(same_bits(got.first, want.first));
  CHECK(same_bits(got.second, want.second));
  CHECK(max_abs_diff(got.second, full.second) > 1e-5);
}

TEST_CASE("the bf16 attention kernel is a process-wide choice, the register layout unless asked") {
  const ops::Bf16AttentionKernel was = ops::bf16_attention_kernel();
  const char* env = std::getenv("PIPELINE_BF16_ATTENTION");
  if (env == nullptr) CHECK(was == ops::Bf16AttentionKernel::Mma);
  for (const auto kernel : {ops::Bf16AttentionKernel::Wmma, ops::Bf16AttentionKernel::MmaRounded}) {
    ops::set_bf16_attention_kernel(kernel);
    CHECK(ops::bf16_attention_kernel() == kernel);
  }
  ops::set_bf16_attention_kernel(was);
  CHECK(ops::bf16_attention_kernel() == was);
}

TEST_CASE("weight matrices are product operands; biases are not") {
  const Linear fc("fc", 4, 3);
  REQUIRE(fc.parameters().size() == 2);
  CHECK(fc.parameters()[0].product_operand);
  CHECK_FALSE(fc.parameters()[1].product_operand);
  const Conv2d conv("conv", 2, 3, 3);
  CHECK(conv.parameters()[0].product_operand);
}

namespace {

// The layer's backward from its bf16-kept records and from the same records widened: the same
// input gradient and weight gradients, bit for bit, whole and split.
void check_same_gradients(const Layer& layer, LayerParams& p, const Saved& saved, const Saved& wide,
                          const Tensor& dy) {
  for (const GradParts parts : {GradParts::Both, GradParts::Input, GradParts::Weight}) {
    std::vector<Tensor> g = layer.zero_grads(), g_wide = layer.zero_grads();
    const Tensor dx = layer.backward(p, saved, dy, g, parts);
    const Tensor dx_wide = layer.backward(p, wide, dy, g_wide, parts);
    if (parts != GradParts::Weight) CHECK(same_bits(dx, dx_wide));
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(same_bits(g[i], g_wide[i]));
  }
}

}  // namespace

TEST_CASE("a transformer block under bf16 keeps its product operands in bf16: same gradients") {
  const TransformerBlock block("block", 32, 4);
  const Tensor x = random({2, 9, 32}, 41), dy = random({2, 9, 32}, 42);
  LayerParams p = block.init(43);
  Saved fp32_saved;
  {
    ForwardContext ctx;
    (void)block.forward(p, x, fp32_saved, ctx);  // float32 compute: nothing narrowed
  }
  CHECK(widened(fp32_saved).bytes() == fp32_saved.bytes());

  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  Saved saved;
  ForwardContext ctx;
  const Tensor y = block.forward(p, x, saved, ctx);
  // Kept in bf16: qkv (3 × 32 per token), and the inputs of qkv, fc1 (32 each) and fc2 (128).
  const std::size_t tokens = 2 * 9, halved = tokens * (3 * 32 + 32 + 32 + 128) * 2;
  const Saved wide = widened(saved);
  CHECK(saved.bytes() + halved == wide.bytes());
  CHECK(wide.bytes() == fp32_saved.bytes());

  check_same_gradients(block, p, saved, wide, dy);
}

namespace {

// The storages of the bfloat16 tensors `saved` keeps, recursively, once per tensor kept.
void bf16_storages(const Saved& saved, std::vector<const void*>& out) {
  for (const Tensor& t : saved.tensors)
    if (t.dtype() == DType::BFloat16) out.push_back(t.storage_id());
  for (const Saved& c : saved.children) bf16_storages(c, out);
}

}  // namespace

TEST_CASE(
    "convolutions under bf16 keep their inputs in bf16, a residual block's x once: same "
    "gradients") {
  const Conv2d conv("conv", 3, 4, 3, 1, 1);
  const ResidualBlock block("block", 4, 8, 2);  // conv1 and the downsampling conv both read x
  const std::pair<const Layer*, Shape> cases[] = {{&conv, Shape{2, 3, 9, 7}},
                                                  {&block, Shape{2, 4, 8, 8}}};
  for (const auto& c : cases) {
    const Layer& layer = *c.first;
    CAPTURE(layer.kind());
    const Tensor x = random(c.second, 81);
    LayerParams p = layer.init(82);
    const ops::ComputeDTypeScope bf16(DType::BFloat16);
    Saved saved;
    ForwardContext ctx;
    const Tensor y = layer.forward(p, x, saved, ctx);
    const Tensor dy = random(y.shape(), 83);
    std::vector<const void*> storages;
    bf16_storages(saved, storages);
    const Saved wide = widened(saved);
    CHECK(saved.bytes() < wide.bytes());
    if (&layer == &conv) {
      CHECK(storages.size() == 1);
    } else {  // conv1 and downsample.0 share one copy of x; conv2 keeps relu1's output
      REQUIRE(storages.size() == 3);
      std::sort(storages.begin(), storages.end());
      CHECK(std::unique(storages.begin(), storages.end()) - storages.begin() == 2);
    }
    check_same_gradients(layer, p, saved, wide, dy);
  }
}

TEST_CASE("Linear keeps its input shared unless asked to keep the product operand") {
  const Linear shared("fc", 8, 5), narrowed("fc", 8, 5, true, SavedInput::ProductOperand);
  const Tensor x = random({6, 8}, 51), dy = random({6, 5}, 52);
  LayerParams p = shared.init(53);
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  Saved a, b;
  ForwardContext ctx;
  (void)shared.forward(p, x, a, ctx);
  (void)narrowed.forward(p, x, b, ctx);
  CHECK(a.tensors.at(0).storage_id() == x.storage_id());
  CHECK(b.tensors.at(0).dtype() == DType::BFloat16);
  std::vector<Tensor> ga = shared.zero_grads(), gb = narrowed.zero_grads();
  CHECK(same_bits(shared.backward(p, a, dy, ga), narrowed.backward(p, b, dy, gb)));
  for (std::size_t i = 0; i < ga.size(); ++i) CHECK(same_bits(ga[i], gb[i]));
}

TEST_CASE("gemm into a bf16 result: the float32 product rounded; Linear written for products") {
  const Tensor a = random({5, 7}, 71), b = random({6, 7}, 72), bias = random({6}, 73);
  for (const DType compute : {DType::Float32, DType::BFloat16}) {
    const ops::ComputeDTypeScope scope(compute);
    Tensor c32 = Tensor::empty({5, 6}), c16 = Tensor::empty({5, 6}, DType::BFloat16);
    ops::gemm(a, false, b, true, c32);
    ops::gemm(a, false, b, true, c16);
    CHECK(same_bits(c16, ops::to_dtype(c32, DType::BFloat16)));
    ops::gemm_bias(a, false, b, true, bias, c32);
    ops::gemm_bias(a, false, b, true, bias, c16);
    CHECK(same_bits(c16, ops::to_dtype(c32, DType::BFloat16)));
    CHECK_THROWS_WITH_AS(ops::gemm(a, false, b, true, c16, 1.f, 1.f),
                         doctest::Contains("never accumulated into"), Error);

    // A Linear written for products: bf16 under a bf16 compute dtype, the same values rounded.
    const Linear wide("fc", 7, 6),
        narrow("fc", 7, 6, true, SavedInput::Shared, ops::OutputAs::ProductOperand);
    LayerParams p = wide.init(74);
    Saved s1, s2;
    ForwardContext ctx;
    const Tensor y32 = wide.forward(p, a, s1, ctx), y = narrow.forward(p, a, s2, ctx);
    // bf16 under a bf16 compute dtype (float32 when PIPELINE_BF16_OUTPUTS=0 turns that off).
    const DType written = ops::output_dtype(ops::OutputAs::ProductOperand);
    CHECK(y.dtype() == written);
    CHECK(written == (ops::bf16_outputs_for_products() ? compute : DType::Float32));
    CHECK(same_bits(y, ops::to_dtype(y32, written)));
  }
}

TEST_CASE("layer norm and GELU written for products: bf16 under bf16, the same bits downstream") {
  const Tensor x = random({6, 16}, 61), dy = random({6, 8}, 62);
  // Each producer once written in float32 and once for products, feeding the same Linear
  // (which keeps its input as a product operand, as in a transformer block).
  const auto run = [&](const Layer& producer, const Linear& fc) {
    LayerParams pp = producer.init(63), pf = fc.init(64);
    Saved sp, sf;
    ForwardContext ctx;
    const Tensor h = producer.forward(pp, x, sp, ctx);
    const Tensor y = fc.forward(pf, h, sf, ctx);
    std::vector<Tensor> gf = fc.zero_grads(), gp = producer.zero_grads();
    const Tensor dh = fc.backward(pf, sf, dy, gf);
    const Tensor dx = producer.backward(pp, sp, dh, gp);
    gf.insert(gf.end(), gp.begin(), gp.end());
    return std::tuple{h.dtype(), y, dx, gf};
  };
  const Linear fc("fc", 16, 8, true, SavedInput::ProductOperand);
  const LayerNorm ln32("ln", 16), ln16("ln", 16, 1e-5f, ops::OutputAs::ProductOperand);
  const GELU gelu32("gelu"), gelu16("gelu", ops::OutputAs::ProductOperand);
  const std::pair<const Layer*, const Layer*> pairs[] = {{&ln32, &ln16}, {&gelu32, &gelu16}};
  for (const DType compute : {DType::Float32, DType::BFloat16}) {
    const ops::ComputeDTypeScope scope(compute);
    for (const auto& pair : pairs) {
      const Layer* wide = pair.first;
      const Layer* narrow = pair.second;
      CAPTURE(wide->kind());
      CAPTURE(dtype_name(compute));
      const auto [dtype32, y32, dx32, g32] = run(*wide, fc);
      const auto [dtype16, y16, dx16, g16] = run(*narrow, fc);
      CHECK(dtype32 == DType::Float32);
      CHECK(dtype16 == ops::output_dtype(ops::OutputAs::ProductOperand));
      CHECK(same_bits(y32, y16));
      CHECK(same_bits(dx32, dx16));
      for (std::size_t i = 0; i < g32.size(); ++i) CHECK(same_bits(g32[i], g16[i]));
    }
  }
  // Written in bf16: the float32 result rounded, for every activation and the layer norm.
  const ops::ComputeDTypeScope bf16(DType::BFloat16);
  for (const ops::Activation a : {ops::Activation::ReLU, ops::Activation::GELU,
                                  ops::Activation::Tanh, ops::Activation::Sigmoid}) {
    Tensor y = Tensor::empty(x.shape(), DType::BFloat16);
    ops::activation_forward(a, x, y);
    CHECK(same_bits(y, ops::to_dtype(ops::activation_forward(a, x), DType::BFloat16)));
  }
  // Tanh and sigmoid differentiate their output, which must then stay float32.
  CHECK_THROWS_WITH_AS(ActivationLayer("t", ops::Activation::Tanh, ops::OutputAs::ProductOperand),
                       doctest::Contains("its backward reads its output, which must stay float32"),
                       ConfigError);
}

TEST_CASE("WeightStore with bf16 stashes: stashed matrices in bf16, the latest in float32") {
  Sequential model("store");
  model.emplace<Linear>("fc1", 6, 5);
  model.emplace<ReLU>("relu");
  model.emplace<Linear>("fc2", 5, 2);
  WeightStore store(model.init(1));
  store.set_bf16_stash(bf16_stash_mask(model, model.all()));
  const ModelParams first = clone_params(store.latest());
  for (int round = 0; round < 3; ++round) {  // the second round reuses the spare copies
    const auto tag = store.acquire_latest();
    ModelParams& next = store.begin_step();
    for (auto& layer : next)
      for (auto& t : layer.params) t.fill(0.25f * static_cast<float>(round + 1));
    const ModelParams& stashed = store.params(tag);
    CHECK(stashed[0].params[0].dtype() == DType::BFloat16);  // fc1.weight
    CHECK(stashed[0].params[1].dtype() == DType::Float32);   // fc1.bias
    CHECK(stashed[2].params[0].dtype() == DType::BFloat16);  // fc2.weight
    for (auto& layer : store.latest())
      for (auto& t : layer.params) CHECK(t.dtype() == DType::Float32);
    if (round == 0) {
      CHECK(same_bits(ops::to_dtype(stashed[0].params[0], DType::Float32),
                      rounded(first[0].params[0])));
      CHECK(same_bits(stashed[0].params[1], first[0].params[1]));
    }
    store.release(tag);
    CHECK(store.size() == 1);
  }
}

namespace {

constexpr int kFeatures = 12, kClasses = 5, kBatch = 8;
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 3;
const pipeline::testing::SyntheticMinibatches minibatch(Shape{kFeatures}, kClasses, kBatch, 512, 5);

Sequential mlp() {
  Sequential m("precision-mlp");
  m.emplace<Linear>("fc1", kFeatures, 32);
  m.emplace<ReLU>("relu1");
  m.emplace<Linear>("fc2", 32, 32);
  m.emplace<ReLU>("relu2");
  m.emplace<Linear>("fc3", 32, kClasses);
  return m;
}

// Each rank's parameters and result after training `schedule` on `layout` with `options`.
std::pair<std::vector<ModelParams>, std::vector<TrainResult>> train_pipeline(
    const Sequential& model, const PipelineLayout& layout, const Schedule& schedule,
    const ExecutorOptions& options) {
  std::vector<ModelParams> params(static_cast<std::size_t>(layout.num_ranks()));
  std::vector<TrainResult> results(params.size());
  std::mutex mutex;
  run_local(layout.num_ranks(), [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm,
                     pipeline::testing::momentum_sgd(), options);
    TrainResult r = ex.train(schedule, minibatch.feed(), 0, [](std::int64_t) { return kLr; });
    std::lock_guard<std::mutex> lock(mutex);
    params[static_cast<std::size_t>(comm.rank())] = ex.params();
    results[static_cast<std::size_t>(comm.rank())] = r;
  });
  return {params, results};
}

}  // namespace

TEST_CASE("a flush pipeline under bf16 equals the single process under bf16") {
  set_num_threads(1);
  const Sequential model = mlp();
  const int minibatches = 3, micro = 4;
  SequentialTrainer ref(model, model.init(kSeed), pipeline::testing::momentum_sgd(), kSeed);
  SequentialTrainer fp32(model, model.init(kSeed), pipeline::testing::momentum_sgd(), kSeed);
  {
    const ops::ComputeDTypeScope bf16(DType::BFloat16);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
  }
  for (int j = 0; j < minibatches; ++j) fp32.step(minibatch(j), kLr, micro);
  const PipelineLayout layout{{{0, 2}, {2, 4}, {4, 5}}, {{0}, {1}, {2}}};
  ScheduleSpec spec;
  spec.stage_ranks = layout.stage_ranks;
  spec.microbatches = micro;
  spec.minibatches = minibatches;
  const auto [got, results] = train_pipeline(model, layout, generate_schedule("1f1b-flush", spec),
                                             {.seed = kSeed, .compute_dtype = DType::BFloat16});
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(max_rel_diff(got[r], ref.params(), layout.stages[r]) <= 1e-6);
  }
  CHECK(max_rel_diff(got[0], fp32.params(), layout.stages[0]) > 1e-5);  // bf16 mattered
}

TEST_CASE("1f1b-stash under bf16: weights stashed in bf16 give the same weights in fewer bytes") {
  set_num_threads(1);
  const Sequential model = mlp();
  const PipelineLayout layout{{{0, 2}, {2, 4}, {4, 5}}, {{0}, {1}, {2}}};
  const Schedule s = generate_schedule("1f1b-stash", ScheduleSpec::straight(3, 1, 8));
  ExecutorOptions options{.seed = kSeed, .compute_dtype = DType::BFloat16};
  const auto [narrow, narrow_results] = train_pipeline(model, layout, s, options);
  options.bf16_stash = false;
  const auto [wide, wide_results] = train_pipeline(model, layout, s, options);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    for (std::size_t l = 0; l < narrow[r].size(); ++l)
      for (std::size_t k = 0; k < narrow[r][l].params.size(); ++k)
        CHECK(same_bits(narrow[r][l].params[k], wide[r][l].params[k]));
    const StageMemory& n = narrow_results[r].peak_memory;
    const StageMemory& w = wide_results[r].peak_memory;
    CHECK(n.parameter_bytes == w.parameter_bytes);
    if (r < 2) {  // stages before the last stash versions: weight matrices at half the bytes
      CHECK(w.stashed_weight_bytes > 0);
      CHECK(n.stashed_weight_bytes < w.stashed_weight_bytes);
      CHECK(n.stashed_weight_bytes > w.stashed_weight_bytes / 2);  // biases stay float32
    }
  }
}

}  // namespace test_precision
