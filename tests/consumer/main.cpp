#include <pipeline/pipeline.hpp>

#include <fmt/format.h>

int main() {
  pipeline::Linear fc("fc", 3, 2);
  auto params = fc.init(7);
  pipeline::Saved saved;
  pipeline::Tensor x = pipeline::Tensor::full({4, 3}, 0.5f);
  pipeline::Tensor y = fc.forward(params, x, saved, {});
  fmt::print("consumer ok: output {}\n", y.shape());
  return y.shape() == pipeline::Shape{4, 2} ? 0 : 1;
}
