#include <pipeline/ops/attention.hpp>

#include "support/gradcheck.hpp"

#include <cmath>
#include <limits>

namespace test_attention {

using namespace pipeline;

namespace {

// Naive attention in double: out[b, t, h·D + d], with an optional causal mask.
std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, std::int64_t B, std::int64_t T,
                              std::int64_t C, std::int64_t H, bool causal) {
  const std::int64_t D = C / H;
  std::vector<double> out(B * T * C, 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> s(T, -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < T; ++j) {
          if (causal && j > i) continue;
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += q[(b * T + i) * C + h * D + d] * k[(b * T + j) * C + h * D + d];
          s[j] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (std::int64_t j = 0; j < T; ++j)
          for (std::int64_t d = 0; d < D; ++d)
            out[(b * T + i) * C + h * D + d] += s[j] / z * v[(b * T + j) * C + h * D + d];
      }
  return out;
}

std::vector<double> to_double(const Tensor& t) {
  return {t.values().begin(), t.values().end()};
}

struct Case {
  std::int64_t B, T, C, H;
};

}  // namespace

TEST_CASE("attention forward matches a naive reference (causal and not)") {
  for (Case c : {Case{1, 1, 4, 1}, Case{2, 5, 6, 3}, Case{3, 7, 10, 1}, Case{1, 17, 12, 3}}) {
    for (bool causal : {true, false}) {
      INFO("B=", c.B, " T=", c.T, " C=", c.C, " H=", c.H, " causal=", causal);
      const Shape s{c.B, c.T, c.C};
      Tensor q = testing::random_tensor(s, 1, -2.f, 2.f),
             k = testing::random_tensor(s, 2, -2.f, 2.f), v = testing::random_tensor(s, 3);
      Tensor out = Tensor::empty(s), probs = Tensor::empty({c.B, c.H, c.T, c.T});
      ops::attention_forward(q, k, v, c.H, out, probs, causal);
      auto want = reference(to_double(q), to_double(k), to_double(v), c.B, c.T, c.C, c.H, causal);
      double worst = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::abs(out.values()[i] - want[i]));
      CHECK(worst < 1e-5);
      // Rows of P are distributions; masked entries are exactly zero.
      for (std::int64_t r = 0; r < c.B * c.H * c.T; ++r) {
        double sum = 0;
        std::int64_t i = r % c.T;
        for (std::int64_t j = 0; j < c.T; ++j) {
          float p = probs.values()[r * c.T + j];
          sum += p;
          if (causal && j > i) CHECK(p == 0.f);
        }
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("attention backward matches central differences of the double reference") {
  for (Case c : {Case{1, 1, 3, 1}, Case{2, 5, 6, 3}, Case{1, 9, 10, 2}}) {
    for (bool causal : {true, false}) {
      INFO("B=", c.B, " T=", c.T, " C=", c.C, " H=", c.H, " causal=", causal);
      const Shape s{c.B, c.T, c.C};
      Tensor q = testing::random_tensor(s, 4, -2.f, 2.f),
             k = testing::random_tensor(s, 5, -2.f, 2.f), v = testing::random_tensor(s, 6),
             r = testing::random_tensor(s, 7);
      Tensor out = Tensor::empty(s), probs = Tensor::empty({c.B, c.H, c.T, c.T});
      ops::attention_forward(q, k, v, c.H, out, probs, causal);
      Tensor dq = Tensor::empty(s), dk = Tensor::empty(s), dv = Tensor::empty(s);
      ops::attention_backward(q, k, v, out, probs, r, c.H, dq, dk, dv, causal);

      std::vector<double> in[3] = {to_double(q), to_double(k), to_double(v)};
      const Tensor* grads[3] = {&dq, &dk, &dv};
      auto rv = to_double(r);
      auto loss = [&] {
        auto o = reference(in[0], in[1], in[2], c.B, c.T, c.C, c.H, causal);
        double l = 0;
        for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * rv[i];
        return l;
      };
      for (int w = 0; w < 3; ++w) {
        double worst = 0, scale = 0;
        for (std::size_t i = 0; i < in[w].size(); ++i) {
          const double x = in[w][i], h = 1e-5;
          in[w][i] = x + h;
          double lp = loss();
          in[w][i] = x - h;
          double lm = loss();
          in[w][i] = x;
          double numeric = (lp - lm) / (2 * h);
          worst = std::max(worst, std::abs(grads[w]->values()[i] - numeric));
          scale = std::max(scale, std::abs(numeric));
        }
        INFO("operand ", "qkv"[w], " worst ", worst, " scale ", scale);
        CHECK(worst < 1e-4 * std::max(1.0, scale));
      }
    }
  }
}

TEST_CASE("causal attention: output at t does not depend on inputs after t") {
  const std::int64_t B = 2, T = 7, C = 6, H = 3;
  const Shape s{B, T, C};
  Tensor q = testing::random_tensor(s, 8), k = testing::random_tensor(s, 9),
         v = testing::random_tensor(s, 10);
  Tensor out = Tensor::empty(s), probs = Tensor::empty({B, H, T, T});
  ops::attention_forward(q, k, v, H, out, probs);
  for (std::int64_t t = 0; t < T - 1; ++t) {
    // Overwrite every q, k, v entry after step t with something else.
    Tensor q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
    for (Tensor* x : {&q2, &k2, &v2})
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = t + 1; j < T; ++j)
          for (std::int64_t d = 0; d < C; ++d) x->data<float>()[(b * T + j) * C + d] += 3.f + d;
    Tensor out2 = Tensor::empty(s), probs2 = Tensor::empty({B, H, T, T});
    ops::attention_forward(q2, k2, v2, H, out2, probs2);
    bool later_changed = false;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < T; ++j)
        for (std::int64_t d = 0; d < C; ++d) {
          float a = out.data<float>()[(b * T + j) * C + d],
                z = out2.data<float>()[(b * T + j) * C + d];
          if (j <= t)
            CHECK(a == z);  // bitwise: masked terms contribute exact zeros
          else if (a != z)
            later_changed = true;
        }
    CHECK(later_changed);
  }
}

TEST_CASE("packed qkv attention equals the separate form") {
  const std::int64_t B = 3, T = 6, C = 9, H = 3;
  Tensor qkv = testing::random_tensor({B, T, 3 * C}, 11);
  Tensor q = Tensor::empty({B, T, C}), k = Tensor::empty({B, T, C}), v = Tensor::empty({B, T, C});
  for (std::int64_t r = 0; r < B * T; ++r)
    for (std::int64_t d = 0; d < C; ++d) {
      q.data<float>()[r * C + d] = qkv.data<float>()[r * 3 * C + d];
      k.data<float>()[r * C + d] = qkv.data<float>()[r * 3 * C + C + d];
      v.data<float>()[r * C + d] = qkv.data<float>()[r * 3 * C + 2 * C + d];
    }
  Tensor o1 = Tensor::empty({B, T, C}), p1 = Tensor::empty({B, H, T, T});
  Tensor o2 = Tensor::empty({B, T, C}), p2 = Tensor::empty({B, H, T, T});
  ops::attention_forward(q, k, v, H, o1, p1);
  ops::attention_forward_packed(qkv, H, o2, p2);
  CHECK(o1.to_vector() == o2.to_vector());
  CHECK(p1.to_vector() == p2.to_vector());

  Tensor dout = testing::random_tensor({B, T, C}, 12);
  Tensor dq = Tensor::empty({B, T, C}), dk = Tensor::empty({B, T, C}),
         dv = Tensor::empty({B, T, C});
  ops::attention_backward(q, k, v, o1, p1, dout, H, dq, dk, dv);
  Tensor dqkv = Tensor::empty({B, T, 3 * C});
  ops::attention_backward_packed(qkv, o2, p2, dout, H, dqkv);
  for (std::int64_t r = 0; r < B * T; ++r)
    for (std::int64_t d = 0; d < C; ++d) {
      CHECK(dqkv.data<float>()[r * 3 * C + d] == dq.data<float>()[r * C + d]);
      CHECK(dqkv.data<float>()[r * 3 * C + C + d] == dk.data<float>()[r * C + d]);
      CHECK(dqkv.data<float>()[r * 3 * C + 2 * C + d] == dv.data<float>()[r * C + d]);
    }
}

TEST_CASE("attention rejects bad shapes") {
  Tensor q = Tensor::zeros({2, 3, 6});
  Tensor out = Tensor::empty({2, 3, 6}), probs = Tensor::empty({2, 4, 3, 3});
  CHECK_THROWS_AS(ops::attention_forward(q, q, q, 4, out, probs), Error);  // 6 % 4 != 0
  Tensor probs2 = Tensor::empty({2, 2, 3, 3});
  CHECK_THROWS_AS(ops::attention_forward(q, q, q, 3, out, probs2), Error);  // probs has 2 heads
  Tensor k = Tensor::zeros({2, 4, 6});
  Tensor probs3 = Tensor::empty({2, 3, 3, 3});
  CHECK_THROWS_AS(ops::attention_forward(q, k, q, 3, out, probs3), Error);
  Tensor qkv = Tensor::zeros({2, 3, 17});
  CHECK_THROWS_AS(ops::attention_forward_packed(qkv, 3, out, probs3), Error);
}

TEST_CASE("attention keeps the probabilities for the backward on the CPU") {
  CHECK(ops::attention_saved_shape(Device::cpu(), 2, 3, 5) == Shape{2, 3, 5, 5});
  CHECK(ops::attention_saved_shape(Device::cuda(0), 2, 3, 5) == Shape{2, 3, 5});
  // A CUDA-shaped record is rejected on the CPU: the backward there needs P itself.
  Tensor q = Tensor::zeros({2, 5, 6}), out = Tensor::empty({2, 5, 6});
  Tensor lse = Tensor::empty({2, 3, 5});
  CHECK_THROWS_AS(ops::attention_forward(q, q, q, 3, out, lse), Error);
}

}  // namespace test_attention
