#include <pipeline/nn/layers/residual_block.hpp>
#include <pipeline/nn/sequential.hpp>

#include "support/gradcheck.hpp"

namespace test_residual_block {

using namespace pipeline;

namespace {

std::vector<std::string> names(const std::vector<ParamSpec>& specs) {
  std::vector<std::string> out;
  for (auto& s : specs) out.push_back(s.name);
  return out;
}

}  // namespace

TEST_CASE("ResidualBlock parameter and buffer names follow torchvision's BasicBlock") {
  ResidualBlock same("layer1.0", 4, 4);
  CHECK_FALSE(same.has_downsample());
  CHECK(names(same.parameters()) == std::vector<std::string>{"conv1.weight", "bn1.weight",
                                                             "bn1.bias", "conv2.weight",
                                                             "bn2.weight", "bn2.bias"});
  CHECK(names(same.buffers()) == std::vector<std::string>{"bn1.running_mean", "bn1.running_var",
                                                          "bn2.running_mean", "bn2.running_var"});
  ResidualBlock down("layer2.0", 4, 6, 2);
  CHECK(down.has_downsample());
  CHECK(names(down.parameters()) ==
        std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight",
                                 "bn2.weight", "bn2.bias", "downsample.0.weight",
                                 "downsample.1.weight", "downsample.1.bias"});
  CHECK(down.parameters()[0].shape == Shape{6, 4, 3, 3});
  CHECK(down.parameters()[6].shape == Shape{6, 4, 1, 1});
  std::vector<std::string> child_names;
  for (auto* c : down.children()) child_names.push_back(c->name());
  CHECK(child_names == std::vector<std::string>{"layer2.0.conv1", "layer2.0.bn1", "layer2.0.relu1",
                                                "layer2.0.conv2", "layer2.0.bn2",
                                                "layer2.0.downsample.0", "layer2.0.downsample.1",
                                                "layer2.0.relu2"});
  CHECK(ResidualBlock("b", 3, 3, 2).has_downsample());  // stride alone changes the shape
}

TEST_CASE("ResidualBlock shapes, FLOPs and errors") {
  ResidualBlock down("b", 3, 5, 2);
  CHECK(down.output_shape({2, 3, 7, 8}) == Shape{2, 5, 4, 4});
  CHECK(ResidualBlock("b", 3, 3).output_shape({1, 3, 5, 5}) == Shape{1, 3, 5, 5});
  CHECK_THROWS_AS(down.output_shape({2, 4, 7, 8}), ConfigError);
  CHECK_THROWS_AS(ResidualBlock("b", 0, 3), ConfigError);
  CHECK_THROWS_AS(ResidualBlock("b", 3, 3, 0), ConfigError);
  // conv1 + conv2 + 1×1 shortcut dominate.
  const double out = 2 * 5 * 4 * 4;
  CHECK(down.flops({2, 3, 7, 8}) >= 2 * out * (3 * 9 + 5 * 9 + 3));
}

TEST_CASE("ResidualBlock init uses qualified keys and is deterministic") {
  ResidualBlock a("layer2.0", 4, 6, 2), b("layer2.0", 4, 6, 2), c("layer3.0", 4, 6, 2);
  LayerParams pa = a.init(9), pb = b.init(9), pc = c.init(9);
  for (std::size_t k = 0; k < pa.params.size(); ++k)
    CHECK(pa.params[k].to_vector() == pb.params[k].to_vector());
  CHECK(pa.params[0].to_vector() != pc.params[0].to_vector());
  CHECK(pa.params[0].to_vector() ==
        Conv2d("layer2.0.conv1", 4, 6, 3, 2, 1, false).init(9).params[0].to_vector());
  CHECK(pa.params[6].to_vector() ==
        Conv2d("layer2.0.downsample.0", 4, 6, 1, 2, 0, false).init(9).params[0].to_vector());
  CHECK(pa.params[1].to_vector() == std::vector<float>(6, 1.f));
  CHECK(pa.buffers[1].to_vector() == std::vector<float>(6, 1.f));
}

TEST_CASE("ResidualBlock forward equals the composition of its parts and updates BN buffers") {
  ResidualBlock blk("b", 3, 4, 2);
  LayerParams p = blk.init(5);
  Tensor x = testing::random_tensor({2, 3, 5, 6}, 6);
  Saved saved;
  Tensor y = blk.forward(p, x, saved, {Mode::Train, 0});

  LayerParams r = blk.init(5);  // fresh buffers for the reference
  auto run = [&](const Layer& l, std::size_t pfirst, std::size_t pcount, std::size_t bfirst,
                 std::size_t bcount, const Tensor& in) {
    LayerParams q;
    for (std::size_t k = 0; k < pcount; ++k) q.params.push_back(r.params[pfirst + k]);
    for (std::size_t k = 0; k < bcount; ++k) q.buffers.push_back(r.buffers[bfirst + k]);
    Saved s;
    return l.forward(q, in, s, {Mode::Train, 0});
  };
  Conv2d conv1("b.conv1", 3, 4, 3, 2, 1, false), conv2("b.conv2", 4, 4, 3, 1, 1, false),
      ds("b.downsample.0", 3, 4, 1, 2, 0, false);
  BatchNorm2d bn1("b.bn1", 4), bn2("b.bn2", 4), dsbn("b.downsample.1", 4);
  ReLU relu("relu");
  Tensor h = run(bn2, 4, 2, 2, 2,
                 run(conv2, 3, 1, 0, 0,
                     run(relu, 0, 0, 0, 0, run(bn1, 1, 2, 0, 2, run(conv1, 0, 1, 0, 0, x)))));
  Tensor s = run(dsbn, 7, 2, 4, 2, run(ds, 6, 1, 0, 0, x));
  for (std::int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] += s.data<float>()[i];
  Tensor want = run(relu, 0, 0, 0, 0, h);
  CHECK(y.to_vector() == want.to_vector());
  for (std::size_t k = 0; k < p.buffers.size(); ++k) {
    CHECK(p.buffers[k].to_vector() == r.buffers[k].to_vector());
    CHECK(p.buffers[k].to_vector() != blk.init(5).buffers[k].to_vector());  // moved by training
  }
}

TEST_CASE("ResidualBlock backward matches finite differences") {
  // ReLU kinks: a small step keeps the perturbations of nearly all sampled coordinates on one
  // side of every kink (the seeds are fixed, so the check is deterministic).
  testing::GradCheckOptions train;
  train.step = 5e-4f;
  testing::check_layer_gradients(ResidualBlock("b", 3, 3), {2, 3, 5, 4}, train);
  testing::check_layer_gradients(ResidualBlock("b", 3, 5, 2), {2, 3, 5, 7}, train);
  testing::check_layer_gradients(ResidualBlock("b", 2, 3, 1), {1, 2, 3, 5}, train);
  testing::GradCheckOptions eval = train;
  eval.mode = Mode::Eval;
  testing::check_layer_gradients(ResidualBlock("b", 3, 5, 2), {1, 3, 5, 5}, eval);
  testing::check_layer_gradients(ResidualBlock("b", 3, 3), {1, 3, 4, 3}, eval);
}

TEST_CASE("ResidualBlock split backward: input-only and weight-only agree with both") {
  for (std::int64_t stride : {std::int64_t{1}, std::int64_t{2}}) {
    ResidualBlock blk("b", 3, stride == 1 ? 3 : 4, stride);
    LayerParams p = blk.init(41);
    Tensor x = testing::random_tensor({2, 3, 6, 5}, 42);
    Saved s;
    Tensor y = blk.forward(p, x, s, {});
    Tensor dy = testing::random_tensor(y.shape(), 43);
    testing::check_split_backward(blk, p, s, dy);
  }
}

TEST_CASE("ResidualBlocks chain in a Sequential") {
  Sequential model("resnet-ish");
  model.emplace<ResidualBlock>("layer1.0", 3, 3);
  model.emplace<ResidualBlock>("layer2.0", 3, 6, 2);
  CHECK(model.output_shape({2, 3, 8, 8}) == Shape{2, 6, 4, 4});
  ModelParams params = model.init(1);
  Tensor x = testing::random_tensor({2, 3, 8, 8}, 2);
  std::vector<Saved> saved;
  Tensor y = model.forward(model.all(), params, x, saved, {});
  ModelGrads grads = model.zero_grads(model.all());
  Tensor dx =
      model.backward(model.all(), params, saved, testing::random_tensor(y.shape(), 3), grads);
  CHECK(dx.shape() == x.shape());
}

}  // namespace test_residual_block
