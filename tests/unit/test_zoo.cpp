#include <pipeline/nn/zoo.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace test_zoo {

using namespace pipeline;

TEST_CASE("fashion-cnn is exactly the published 2-conv network") {
  ZooModel z = make_model("fashion-cnn");
  std::vector<std::string> names, kinds;
  for (int i = 0; i < z.model.size(); ++i) {
    names.push_back(z.model.layer(i).name());
    kinds.push_back(z.model.layer(i).kind());
  }
  CHECK(names == std::vector<std::string>{"conv1", "relu1", "pool1", "conv2", "relu2", "pool2",
                                          "flatten", "fc1", "relu3", "fc2"});
  auto shapes = z.model.shapes({8, 1, 28, 28}, z.model.all());
  CHECK(shapes[1] == Shape{8, 32, 28, 28});
  CHECK(shapes[4] == Shape{8, 64, 14, 14});
  CHECK(shapes[7] == Shape{8, 3136});
  CHECK(shapes.back() == Shape{8, 10});
  std::size_t params = 0;
  for (int i = 0; i < z.model.size(); ++i) params += z.model.layer(i).parameter_bytes();
  // conv1 32·1·25+32, conv2 64·32·25+64, fc1 3136·1024+1024, fc2 1024·10+10
  CHECK(params == 4u * (832 + 51264 + 3212288 + 10250));
}

TEST_CASE("every zoo model builds, infers shapes and runs forward and backward") {
  ZooOptions small;
  small.width = 0.125;
  small.dim = 16;
  small.heads = 2;
  small.blocks = 2;
  small.seq_len = 8;
  for (const std::string& name : zoo_model_names()) {
    CAPTURE(name);
    ZooModel z = make_model(name, small);
    Shape in = z.input_shape(2);
    Shape out = z.model.output_shape(in);
    CHECK(out[-1] == z.num_classes);
    ModelParams p = z.model.init(3);
    Tensor x = Tensor::zeros(in, z.input_dtype);
    if (z.input_dtype == DType::Float32) Rng(1).fill_uniform(x, 0.f, 1.f);
    std::vector<Saved> saved;
    Tensor y = z.model.forward(z.model.all(), p, x, saved, {Mode::Train, 5});
    CHECK(y.shape() == out);
    ModelGrads g = z.model.zero_grads(z.model.all());
    Tensor dy = Tensor::full(out, 0.01f);
    z.model.backward(z.model.all(), p, saved, dy, g, false);
    double norm = 0;
    for (auto& layer : g)
      for (auto& t : layer)
        for (float v : t.values()) norm += static_cast<double>(v) * v;
    CHECK(norm > 0);
  }
}

TEST_CASE("a zoo model's architecture is its resolved options; first_difference names a flag") {
  const ZooModel cnn = make_model("fashion-cnn");
  CHECK(cnn.architecture ==
        Architecture{{"channels", 1}, {"image_size", 28}, {"num_classes", 10}, {"width", 1}});
  ZooOptions o;
  o.heads = 8;
  const ZooModel lm4 = make_model("transformer-lm"), lm8 = make_model("transformer-lm", o);
  CHECK_FALSE(first_difference(lm4.architecture, lm4.architecture));
  const auto d = first_difference(lm4.architecture, lm8.architecture);
  REQUIRE(d);
  CHECK(d->flag == "--heads");
  CHECK(d->recorded == "4");
  CHECK(d->ours == "8");
  o = {};
  o.seq_len = 32;
  CHECK(first_difference(lm4.architecture, make_model("transformer-lm", o).architecture)->flag ==
        "--seq-len");
  // Every differing option, as flags, for a message that names the whole fix.
  o.heads = 8;
  const auto both =
      first_difference(lm4.architecture, make_model("transformer-lm", o).architecture);
  REQUIRE(both);
  CHECK(both->recorded_flags == "--seq-len 64 --heads 4");  // in the recorded order
  CHECK(both->our_flags == "--seq-len 32 --heads 8");
  // Options only one side records are not compared (files written before they were recorded).
  CHECK_FALSE(first_difference({}, lm8.architecture));
  CHECK_FALSE(first_difference({{"depth", 3}}, lm8.architecture));
}

TEST_CASE("zoo rejects unknown names and impossible options") {
  CHECK_THROWS_WITH_AS(make_model("resnet-9000"), doctest::Contains("fashion-cnn"), ConfigError);
  ZooOptions bad;
  bad.heads = 3;
  bad.dim = 16;
  CHECK_THROWS_AS(make_model("transformer-lm", bad), ConfigError);
  ZooOptions tiny;
  tiny.image_size = 8;
  CHECK_THROWS_AS(make_model("vgg16", tiny), ConfigError);
}

}  // namespace test_zoo
