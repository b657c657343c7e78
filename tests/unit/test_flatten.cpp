#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/flatten.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/sequential.hpp>

#include "support/gradcheck.hpp"

#include <algorithm>

namespace test_flatten {

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

TEST_CASE("a backward that needs no input gradient skips it under parameter-free bottom layers") {
  // Flatten, Linear, ReLU, Linear: the first Linear's input gradient would only reach the
  // Flatten, which has nothing to train.
  Sequential model("mlp");
  model.emplace<Flatten>("flatten");
  model.emplace<Linear>("fc1", 12, 8);
  model.emplace<ReLU>("relu");
  model.emplace<Linear>("fc2", 8, 3);
  CHECK(model.first_input_grad_layer(model.all(), true) == 0);
  CHECK(model.first_input_grad_layer(model.all(), false) == 2);
  CHECK(model.first_input_grad_layer({1, 4}, false) == 2);
  CHECK(model.first_input_grad_layer({2, 4}, false) == 4);  // ReLU, then fc2 at the bottom
  CHECK(model.first_input_grad_layer({2, 3}, false) == 3);  // nothing to train: nothing to do

  ModelParams params = model.init(3);
  const Tensor x = testing::random_tensor({5, 3, 4}, 4);
  std::vector<Saved> saved;
  const Tensor y = model.forward(model.all(), params, x, saved, {});
  const Tensor dy = testing::random_tensor(y.shape(), 5);
  ModelGrads with = model.zero_grads(model.all()), without = model.zero_grads(model.all());
  const Tensor dx = model.backward(model.all(), params, saved, dy, with, true);
  CHECK(dx.shape() == x.shape());
  CHECK_FALSE(model.backward(model.all(), params, saved, dy, without, false).defined());
  // The weight gradients are the same bits either way.
  for (std::size_t l = 0; l < with.size(); ++l)
    for (std::size_t p = 0; p < with[l].size(); ++p) {
      CAPTURE(l);
      const auto a = with[l][p].values(), b = without[l][p].values();
      CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    }
}

}  // namespace test_flatten
