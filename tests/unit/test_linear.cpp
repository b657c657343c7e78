#include <pipeline/nn/layers/linear.hpp>

#include "support/gradcheck.hpp"

namespace test_linear {

using namespace pipeline;

TEST_CASE("Linear backward matches finite differences") {
  testing::check_layer_gradients(Linear("fc", 7, 5), {3, 7});
  testing::check_layer_gradients(Linear("fc", 1, 3), {1, 1});
  testing::check_layer_gradients(Linear("fc", 6, 4, false), {2, 3, 6});
}

TEST_CASE("Linear reports shapes, FLOPs and parameters") {
  Linear fc("fc1", 3136, 1024);
  CHECK(fc.output_shape({64, 3136}) == Shape{64, 1024});
  CHECK(fc.flops({64, 3136}) == doctest::Approx(2.0 * 64 * 3136 * 1024));
  CHECK(fc.parameter_bytes() == (3136 * 1024 + 1024) * 4);
  CHECK_THROWS_AS(fc.output_shape({64, 100}), ConfigError);
}

TEST_CASE("Linear parameters depend only on seed and name") {
  Linear a("fc", 4, 3), b("fc", 4, 3), c("other", 4, 3);
  auto pa = a.init(5), pb = b.init(5), pc = c.init(5);
  CHECK(pa.params[0].to_vector() == pb.params[0].to_vector());
  CHECK(pa.params[0].to_vector() != pc.params[0].to_vector());
}

TEST_CASE("parameters of another shape are refused naming the layer and the parameter") {
  const Linear fc("fc1", 4, 3), wider("fc1", 4, 5);
  LayerParams other = wider.init(1);
  Saved saved;
  CHECK_THROWS_WITH_AS(
      fc.forward(other, Tensor::zeros(Shape{2, 4}), saved, {Mode::Train, 0}),
      doctest::Contains("layer 'fc1' (Linear) expects its 'weight' of shape [3, 4], got [5, 4]"),
      Error);
}

}  // namespace test_linear
