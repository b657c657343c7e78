#include <pipeline/nn/layers/embedding.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/sequential.hpp>

#include "support/gradcheck.hpp"

namespace test_embedding {

using namespace pipeline;

namespace {

Tensor random_ids(const Shape& s, std::int64_t vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> v(static_cast<std::size_t>(s.numel()));
  for (auto& id : v) id = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  return Tensor::from_ints(s, v);
}

}  // namespace

TEST_CASE("embedding lookup and scatter-add gradient match a naive reference") {
  const std::int64_t V = 11, D = 7;
  Tensor table = testing::random_tensor({V, D}, 1);
  // Repeated ids on purpose: their gradients must add up.
  Tensor ids = Tensor::from_ints({2, 5}, {3, 0, 10, 3, 3, 7, 0, 1, 10, 4});
  Tensor out = Tensor::empty({2, 5, D});
  ops::embedding_forward(ids, table, out);
  for (std::int64_t i = 0; i < 10; ++i)
    for (std::int64_t d = 0; d < D; ++d)
      CHECK(out.data<float>()[i * D + d] ==
            table.data<float>()[ids.data<std::int32_t>()[i] * D + d]);

  Tensor dout = testing::random_tensor({2, 5, D}, 2);
  Tensor dtable = testing::random_tensor({V, D}, 3);  // accumulates on top of what is there
  std::vector<double> want(dtable.values().begin(), dtable.values().end());
  for (std::int64_t i = 0; i < 10; ++i)
    for (std::int64_t d = 0; d < D; ++d)
      want[ids.data<std::int32_t>()[i] * D + d] += dout.data<float>()[i * D + d];
  ops::embedding_backward(ids, dout, dtable);
  for (std::int64_t i = 0; i < V * D; ++i)
    CHECK(dtable.data<float>()[i] == doctest::Approx(want[i]));
}

TEST_CASE("embedding gradient on the multi-threaded path equals the serial sum") {
  const std::int64_t V = 50, D = 300, B = 4, T = 64;
  Tensor ids = random_ids({B, T}, V, 9);
  Tensor dout = testing::random_tensor({B, T, D}, 10);
  Tensor dtable = Tensor::zeros({V, D});
  ops::embedding_backward(ids, dout, dtable);
  std::vector<double> want(V * D, 0.0);
  for (std::int64_t i = 0; i < B * T; ++i)
    for (std::int64_t d = 0; d < D; ++d)
      want[ids.data<std::int32_t>()[i] * D + d] += dout.data<float>()[i * D + d];
  double worst = 0;
  for (std::int64_t i = 0; i < V * D; ++i)
    worst = std::max(worst, std::abs(dtable.data<float>()[i] - want[i]));
  CHECK(worst < 1e-4);
}

TEST_CASE("embedding rejects out-of-range ids and non-int32 input with a clear error") {
  Embedding emb("tok", 5, 3);
  LayerParams p = emb.init(1);
  Saved saved;
  for (std::int32_t bad : {5, -1, 1000}) {
    Tensor ids = Tensor::from_ints({1, 3}, {0, bad, 2});
    try {
      emb.forward(p, ids, saved, {});
      FAIL("expected an error for id ", bad);
    } catch (const Error& e) {
      std::string msg = e.what();
      CHECK(msg.find(std::to_string(bad)) != std::string::npos);
      CHECK(msg.find("[0, 5)") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(emb.forward(p, Tensor::zeros({1, 3}), saved, {}), ConfigError);
  Embedding pos("tok", 5, 3, 4);
  CHECK_THROWS_AS(pos.output_shape({2, 5}), ConfigError);
  CHECK(pos.output_shape({2, 4}) == Shape{2, 4, 3});
  CHECK_THROWS_AS(Embedding("e", 0, 3), ConfigError);
}

TEST_CASE("positional embedding is added per time step") {
  Embedding emb("tok", 6, 4, 8);
  LayerParams p = emb.init(2);
  Tensor ids = Tensor::from_ints({2, 3}, {1, 2, 3, 1, 1, 5});
  Saved saved;
  Tensor y = emb.forward(p, ids, saved, {});
  REQUIRE(y.shape() == Shape{2, 3, 4});
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 3; ++t)
      for (int d = 0; d < 4; ++d) {
        float want = p.params[0].data<float>()[ids.data<std::int32_t>()[b * 3 + t] * 4 + d] +
                     p.params[1].data<float>()[t * 4 + d];
        CHECK(y.data<float>()[(b * 3 + t) * 4 + d] == doctest::Approx(want));
      }
}

TEST_CASE("Embedding parameter gradients match finite differences") {
  for (std::int64_t max_pos : {std::int64_t{0}, std::int64_t{9}}) {
    for (const Shape& s : {Shape{1, 1}, Shape{3, 5}, Shape{2, 9}}) {
      Embedding emb("tok", 13, 6, max_pos);
      testing::GradCheckOptions o;
      o.check_input = false;
      o.input = random_ids(s, 13, 77 + s[1]);
      if (max_pos == 0 || s[1] <= max_pos) testing::check_layer_gradients(emb, s, o);
    }
  }
}

TEST_CASE("Embedding initialisation follows PyTorch and depends only on seed and name") {
  Embedding a("tok", 200, 50, 100), b("tok", 200, 50, 100);
  auto pa = a.init(3), pb = b.init(3);
  CHECK(pa.params[0].to_vector() == pb.params[0].to_vector());
  auto std_of = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (float v : t.values()) s += v, s2 += double(v) * v;
    double n = static_cast<double>(t.numel());
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  CHECK(std_of(pa.params[0]) == doctest::Approx(1.0).epsilon(0.05));
  CHECK(std_of(pa.params[1]) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(a.parameters()[1].name == "position");
}

TEST_CASE("Sequential backward through a leading Embedding returns no input gradient") {
  Sequential model("lm");
  model.emplace<Embedding>("tok", 10, 4, 6);
  model.emplace<Linear>("head", 4, 10);
  ModelParams params = model.init(1);
  Tensor ids = random_ids({2, 6}, 10, 4);
  std::vector<Saved> saved;
  Tensor y = model.forward(model.all(), params, ids, saved, {});
  CHECK(y.shape() == Shape{2, 6, 10});
  ModelGrads grads = model.zero_grads(model.all());
  Tensor dx =
      model.backward(model.all(), params, saved, testing::random_tensor(y.shape(), 5), grads);
  CHECK_FALSE(dx.defined());
  double norm = 0;
  for (float v : grads[0][0].values()) norm += std::abs(v);
  CHECK(norm > 0);
}

}  // namespace test_embedding
