#include <pipeline/ops/attention.hpp>

#include "eigen_maps.hpp"

#include <cmath>
#include <limits>
#include <utility>

namespace pipeline::ops {

namespace {

using detail::RowMatrix;
using StridedMap = Eigen::Map<RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

// Where the q, k and v rows of one batch element live: base pointers and the row stride (the
// stride is C for separate tensors and 3C for packed qkv).
struct Layout {
  std::int64_t batch, steps, channels, heads, head_dim;
};

struct Operands {
  const float* q;
  const float* k;
  const float* v;
  std::int64_t in_stride;  // row stride of q, k, v
};

struct GradOperands {
  float* dq;
  float* dk;
  float* dv;
  std::int64_t stride;
};

Layout check_layout(const char* op, const Tensor& out_like, std::int64_t heads) {
  PIPELINE_CHECK(out_like.rank() == 3 && out_like.dtype() == DType::Float32,
                 "{}: expected a float32 [B, T, C] tensor, got {} {}", op,
                 dtype_name(out_like.dtype()), out_like.shape());
  const std::int64_t c = out_like.dim(2);
  PIPELINE_CHECK(heads > 0 && c % heads == 0 && c > 0,
                 "{}: {} channels cannot be split into {} heads; channels must be a positive "
                 "multiple of heads",
                 op, c, heads);
  return {out_like.dim(0), out_like.dim(1), c, heads, c / heads};
}

void check_shape(const char* op, const char* what, const Tensor& t, const Shape& want) {
  PIPELINE_CHECK(t.dtype() == DType::Float32 && t.shape() == want,
                 "{}: {} must be float32 {}, got {} {}", op, what, want, dtype_name(t.dtype()),
                 t.shape());
}

void forward_impl(const Layout& L, const Operands& in, float* out, float* probs, bool causal) {
  const std::int64_t T = L.steps, D = L.head_dim, C = L.channels;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const std::int64_t pairs = L.batch * L.heads;
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1 && T * T * D >= 4096)
  for (std::int64_t bh = 0; bh < pairs; ++bh) {
    const std::int64_t b = bh / L.heads, h = bh % L.heads;
    const std::int64_t row0 = b * T * in.in_stride + h * D;
    ConstStridedMap Q(in.q + row0, T, D, Eigen::OuterStride<>(in.in_stride));
    ConstStridedMap K(in.k + row0, T, D, Eigen::OuterStride<>(in.in_stride));
    ConstStridedMap V(in.v + row0, T, D, Eigen::OuterStride<>(in.in_stride));
    detail::MatrixMap P(probs + bh * T * T, T, T);
    StridedMap O(out + b * T * C + h * D, T, D, Eigen::OuterStride<>(C));
    P.noalias() = scale * (Q * K.transpose());
    for (std::int64_t i = 0; i < T; ++i) {
      // Row i sees columns [0, i] when causal; max-subtraction keeps exp() in range.
      const std::int64_t n = causal ? i + 1 : T;
      auto row = P.row(i).head(n).array();
      row = (row - row.maxCoeff()).exp();
      row /= row.sum();
      if (n < T) P.row(i).tail(T - n).setZero();
    }
    O.noalias() = P * V;
  }
}

void backward_impl(const Layout& L, const Operands& in, const float* probs, const float* dout,
                   const GradOperands& g) {
  const std::int64_t T = L.steps, D = L.head_dim, C = L.channels;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const std::int64_t pairs = L.batch * L.heads;
#pragma omp parallel if (pairs > 1 && T * T * D >= 4096)
  {
    RowMatrix dS(T, T);  // per-thread scratch: dP, then dS in place
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t bh = 0; bh < pairs; ++bh) {
      const std::int64_t b = bh / L.heads, h = bh % L.heads;
      const std::int64_t row0 = b * T * in.in_stride + h * D;
      const Eigen::OuterStride<> s_in(in.in_stride), s_g(g.stride), s_c(C);
      ConstStridedMap Q(in.q + row0, T, D, s_in), K(in.k + row0, T, D, s_in),
          V(in.v + row0, T, D, s_in);
      detail::ConstMatrixMap P(probs + bh * T * T, T, T);
      ConstStridedMap dO(dout + b * T * C + h * D, T, D, s_c);
      const std::int64_t grow0 = b * T * g.stride + h * D;
      StridedMap dQ(g.dq + grow0, T, D, s_g), dK(g.dk + grow0, T, D, s_g),
          dV(g.dv + grow0, T, D, s_g);

      dV.noalias() = P.transpose() * dO;
      dS.noalias() = dO * V.transpose();
      // Softmax backward per row; masked entries have P = 0 and so get dS = 0.
      auto rowdot = (dS.array() * P.array()).rowwise().sum().eval();
      dS.array() = P.array() * (dS.array().colwise() - rowdot);
      dQ.noalias() = scale * (dS * K);
      dK.noalias() = scale * (dS.transpose() * Q);
    }
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                       Tensor& out, Tensor& probs, bool causal) {
  const Layout L = check_layout("attention_forward", q, heads);
  check_shape("attention_forward", "k", k, q.shape());
  check_shape("attention_forward", "v", v, q.shape());
  check_shape("attention_forward", "out", out, q.shape());
  check_shape("attention_forward", "probs", probs, Shape{L.batch, heads, L.steps, L.steps});
  if (q.numel() == 0) return;
  forward_impl(L, {q.data<float>(), k.data<float>(), v.data<float>(), L.channels},
               out.data<float>(), probs.data<float>(), causal);
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const Tensor& dout, std::int64_t heads, Tensor& dq, Tensor& dk,
                        Tensor& dv) {
  const Layout L = check_layout("attention_backward", q, heads);
  for (auto [what, t] : {std::pair{"k", &k}, std::pair{"v", &v}, std::pair{"dout", &dout},
                         std::pair{"dq", static_cast<const Tensor*>(&dq)},
                         std::pair{"dk", static_cast<const Tensor*>(&dk)},
                         std::pair{"dv", static_cast<const Tensor*>(&dv)}})
    check_shape("attention_backward", what, *t, q.shape());
  check_shape("attention_backward", "probs", probs, Shape{L.batch, heads, L.steps, L.steps});
  if (q.numel() == 0) return;
  backward_impl(L, {q.data<float>(), k.data<float>(), v.data<float>(), L.channels},
                probs.data<float>(), dout.data<float>(),
                {dq.data<float>(), dk.data<float>(), dv.data<float>(), L.channels});
}

void attention_forward_packed(const Tensor& qkv, std::int64_t heads, Tensor& out, Tensor& probs,
                              bool causal) {
  const Layout L = check_layout("attention_forward_packed", out, heads);
  check_shape("attention_forward_packed", "qkv", qkv, Shape{L.batch, L.steps, 3 * L.channels});
  check_shape("attention_forward_packed", "probs", probs, Shape{L.batch, heads, L.steps, L.steps});
  if (out.numel() == 0) return;
  const float* p = qkv.data<float>();
  forward_impl(L, {p, p + L.channels, p + 2 * L.channels, 3 * L.channels}, out.data<float>(),
               probs.data<float>(), causal);
}

void attention_backward_packed(const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                               std::int64_t heads, Tensor& dqkv) {
  const Layout L = check_layout("attention_backward_packed", dout, heads);
  const Shape packed{L.batch, L.steps, 3 * L.channels};
  check_shape("attention_backward_packed", "qkv", qkv, packed);
  check_shape("attention_backward_packed", "dqkv", dqkv, packed);
  check_shape("attention_backward_packed", "probs", probs, Shape{L.batch, heads, L.steps, L.steps});
  if (dout.numel() == 0) return;
  const float* p = qkv.data<float>();
  float* d = dqkv.data<float>();
  backward_impl(L, {p, p + L.channels, p + 2 * L.channels, 3 * L.channels}, probs.data<float>(),
                dout.data<float>(), {d, d + L.channels, d + 2 * L.channels, 3 * L.channels});
}

}  // namespace pipeline::ops
