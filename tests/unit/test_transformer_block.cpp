#include <pipeline/nn/layers/transformer_block.hpp>
#include <pipeline/nn/sequential.hpp>

#include "support/gradcheck.hpp"

namespace test_transformer_block {

using namespace pipeline;

namespace {

std::vector<std::string> names(const std::vector<ParamSpec>& specs) {
  std::vector<std::string> out;
  for (auto& s : specs) out.push_back(s.name);
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(a.data<float>()[i] - b.data<float>()[i])));
  return worst;
}

}  // namespace

TEST_CASE("TransformerBlock parameter names, shapes and children") {
  TransformerBlock blk("h0", 6, 3, 2);
  CHECK(names(blk.parameters()) == std::vector<std::string>{"ln1.weight", "ln1.bias", "qkv.weight",
                                                            "qkv.bias", "proj.weight", "proj.bias",
                                                            "ln2.weight", "ln2.bias", "fc1.weight",
                                                            "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(blk.parameters()[2].shape == Shape{18, 6});
  CHECK(blk.parameters()[8].shape == Shape{12, 6});
  CHECK(blk.parameters()[10].shape == Shape{6, 12});
  CHECK(blk.buffers().empty());
  std::vector<std::string> child_names;
  for (auto* c : blk.children()) child_names.push_back(c->name());
  CHECK(child_names == std::vector<std::string>{"h0.ln1", "h0.qkv", "h0.proj", "h0.ln2", "h0.fc1",
                                                "h0.gelu", "h0.fc2"});
  CHECK(blk.output_shape({2, 5, 6}) == Shape{2, 5, 6});
  CHECK_THROWS_AS(blk.output_shape({2, 5, 7}), ConfigError);
  CHECK_THROWS_AS(blk.output_shape({10, 6}), ConfigError);
  CHECK_THROWS_AS(TransformerBlock("bad", 8, 3), ConfigError);
  CHECK_THROWS_AS(TransformerBlock("bad", 8, 2, 4, 1.f), ConfigError);
  // The matmuls dominate: 2·rows·(3d² + d² + 2·r·d²) + 4·B·T²·d.
  const double rows = 2 * 5, d = 6;
  CHECK(blk.flops({2, 5, 6}) >= 2 * rows * (4 * d * d + 2 * 2 * d * d) + 4 * 2 * 25 * d);
  CHECK(blk.parameter_bytes() == 4u * (2 * 6 + 18 * 6 + 18 + 36 + 6 + 2 * 6 + 72 + 12 + 72 + 6));
}

TEST_CASE("TransformerBlock init uses the children's qualified keys, deterministically") {
  TransformerBlock a("h0", 6, 3), b("h0", 6, 3), c("h1", 6, 3);
  LayerParams pa = a.init(7), pb = b.init(7), pc = c.init(7);
  for (std::size_t k = 0; k < pa.params.size(); ++k)
    CHECK(pa.params[k].to_vector() == pb.params[k].to_vector());
  CHECK(pa.params[2].to_vector() != pc.params[2].to_vector());
  // "qkv.weight" of block "h0" is the tensor a Linear named "h0.qkv" would draw.
  Linear qkv("h0.qkv", 6, 18);
  CHECK(pa.params[2].to_vector() == qkv.init(7).params[0].to_vector());
  Linear fc2("h0.fc2", 24, 6);
  CHECK(pa.params[11].to_vector() == fc2.init(7).params[1].to_vector());
  CHECK(pa.params[0].to_vector() == std::vector<float>(6, 1.f));  // LayerNorm weight: ones
}

TEST_CASE("TransformerBlock forward equals the composition of its parts") {
  const std::int64_t B = 2, T = 5, C = 6, H = 3;
  TransformerBlock blk("h0", C, H, 3);
  LayerParams p = blk.init(11);
  for (auto& t : p.params)  // non-trivial layer-norm affine parameters too
    for (float& v : t.values()) v += 0.1f;
  Tensor x = testing::random_tensor({B, T, C}, 12);
  Saved saved;
  Tensor y = blk.forward(p, x, saved, {});

  LayerNorm ln1("h0.ln1", C), ln2("h0.ln2", C);
  Linear qkv("h0.qkv", C, 3 * C), proj("h0.proj", C, C), fc1("h0.fc1", C, 3 * C),
      fc2("h0.fc2", 3 * C, C);
  GELU gelu("h0.gelu");
  auto run = [&](const Layer& l, std::size_t first, std::size_t count, const Tensor& in) {
    LayerParams q;
    for (std::size_t k = 0; k < count; ++k) q.params.push_back(p.params[first + k]);
    Saved s;
    return l.forward(q, in, s, {});
  };
  Tensor h = run(qkv, 2, 2, run(ln1, 0, 2, x));
  Tensor attn = Tensor::empty({B, T, C}), probs = Tensor::empty({B, H, T, T});
  ops::attention_forward_packed(h, H, attn, probs);
  Tensor x1 = run(proj, 4, 2, attn);
  for (std::int64_t i = 0; i < x1.numel(); ++i) x1.data<float>()[i] += x.data<float>()[i];
  Tensor m = run(fc2, 10, 2, run(gelu, 0, 0, run(fc1, 8, 2, run(ln2, 6, 2, x1))));
  for (std::int64_t i = 0; i < m.numel(); ++i) m.data<float>()[i] += x1.data<float>()[i];
  CHECK(max_abs_diff(y, m) == 0.0);
  CHECK(saved.children.size() == 7);
}

TEST_CASE("TransformerBlock backward matches finite differences") {
  testing::check_layer_gradients(TransformerBlock("h", 6, 3, 2), {1, 1, 6});
  testing::check_layer_gradients(TransformerBlock("h", 6, 1, 2), {2, 5, 6});
  testing::check_layer_gradients(TransformerBlock("h", 9, 3, 1), {2, 3, 9});
  testing::check_layer_gradients(TransformerBlock("h", 5, 1, 3), {1, 7, 5});
}

TEST_CASE("TransformerBlock with dropout: train draws masks from the seed, eval is deterministic") {
  TransformerBlock drop("h", 6, 3, 2, 0.3f), plain("h", 6, 3, 2, 0.f);
  LayerParams p = drop.init(3);
  Tensor x = testing::random_tensor({2, 4, 6}, 4);
  Saved s1, s2, s3, s4;
  Tensor e1 = drop.forward(p, x, s1, {Mode::Eval, 1});
  Tensor e2 = plain.forward(p, x, s2, {Mode::Train, 1});
  CHECK(e1.to_vector() == e2.to_vector());
  Tensor t1 = drop.forward(p, x, s3, {Mode::Train, 5});
  Tensor t2 = drop.forward(p, x, s4, {Mode::Train, 5});
  CHECK(t1.to_vector() == t2.to_vector());
  CHECK(t1.to_vector() != e1.to_vector());
  // The gradient check fixes the context seed, so the masks are the same in every evaluation.
  testing::check_layer_gradients(TransformerBlock("h", 6, 3, 2, 0.25f), {2, 3, 6});
}

TEST_CASE("TransformerBlock is causal: output at t does not depend on inputs after t") {
  const std::int64_t B = 2, T = 6, C = 6;
  TransformerBlock blk("h", C, 3);
  LayerParams p = blk.init(21);
  Tensor x = testing::random_tensor({B, T, C}, 22);
  Saved s;
  Tensor y = blk.forward(p, x, s, {});
  for (std::int64_t t = 0; t < T - 1; ++t) {
    Tensor x2 = x.clone();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = t + 1; j < T; ++j)
        for (std::int64_t d = 0; d < C; ++d) x2.data<float>()[(b * T + j) * C + d] = 5.f - d;
    Saved s2;
    Tensor y2 = blk.forward(p, x2, s2, {});
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j <= t; ++j)
        for (std::int64_t d = 0; d < C; ++d)
          CHECK(y.data<float>()[(b * T + j) * C + d] == y2.data<float>()[(b * T + j) * C + d]);
  }
}

TEST_CASE("TransformerBlock split backward: input-only and weight-only agree with both") {
  TransformerBlock blk("h", 6, 2, 2);
  LayerParams p = blk.init(31);
  Tensor x = testing::random_tensor({2, 4, 6}, 32), dy = testing::random_tensor({2, 4, 6}, 33);
  Saved s;
  blk.forward(p, x, s, {});
  testing::check_split_backward(blk, p, s, dy);
}

TEST_CASE("a stack of TransformerBlocks trains through Sequential") {
  Sequential model("gpt");
  model.emplace<TransformerBlock>("h0", 6, 3, 2);
  model.emplace<TransformerBlock>("h1", 6, 3, 2);
  ModelParams params = model.init(1);
  Tensor x = testing::random_tensor({2, 3, 6}, 2);
  std::vector<Saved> saved;
  Tensor y = model.forward(model.all(), params, x, saved, {});
  ModelGrads grads = model.zero_grads(model.all());
  Tensor dx =
      model.backward(model.all(), params, saved, testing::random_tensor(y.shape(), 3), grads);
  CHECK(dx.shape() == x.shape());
  CHECK(grads[0].size() == 12);
}

}  // namespace test_transformer_block
