#include <pipeline/nn/layers/flatten.hpp>

#include "support/gradcheck.hpp"

using namespace pipeline;

TEST_CASE("Flatten is a view of its input and reshapes the gradient back") {
  Flatten flat("flatten");
  CHECK(flat.kind() == "Flatten");
  CHECK(flat.output_shape({64, 64, 7, 7}) == Shape{64, 3136});
  CHECK(flat.output_shape({3, 5}) == Shape{3, 5});
  CHECK(flat.flops({64, 64, 7, 7}) == 0.0);
  CHECK_THROWS_AS(flat.output_shape({7}), ConfigError);

  LayerParams p;
  Saved saved;
  Tensor x = testing::random_tensor({2, 3, 4, 5}, 1);
  Tensor y = flat.forward(p, x, saved, {});
  CHECK(y.shape() == Shape{2, 60});
  CHECK(y.same_storage(x));
  CHECK(y.to_vector() == x.to_vector());
  Tensor dy = testing::random_tensor({2, 60}, 2);
  std::vector<Tensor> none;
  Tensor dx = flat.backward(p, saved, dy, none);
  CHECK(dx.shape() == x.shape());
  CHECK(dx.to_vector() == dy.to_vector());
}

TEST_CASE("Flatten backward matches finite differences") {
  testing::check_layer_gradients(Flatten("flatten"), {1, 3, 5, 2});
  testing::check_layer_gradients(Flatten("flatten"), {3, 7});
}
