#include <pipeline/core/log.hpp>
#include <pipeline/ops/attention.hpp>
#include <pipeline/ops/precision.hpp>

#include "../core/parallel.hpp"
#include "cuda_dispatch.hpp"
#include "eigen_maps.hpp"
#include "split_product.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#if PIPELINE_WITH_CUDA
#include "attention.cuh"
#endif

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

// The one device all of an op's tensors are on (ConfigError naming two that differ).
Device op_device(const char* op, std::initializer_list<const Tensor*> tensors) {
#if PIPELINE_WITH_CUDA
  return detail::common_device(op, tensors);
#else
  (void)op;
  (void)tensors;
  return Device::cpu();
#endif
}

// The (sample, head) pairs go to every thread once a head's products pass 4096 multiply-adds;
// below that, one thread takes them all.
int head_threads(std::int64_t T, std::int64_t D) {
  return T * T * D >= 4096 ? num_threads() : 1;
}

void forward_impl(const Layout& L, const Operands& in, float* out, float* probs, bool causal) {
  const std::int64_t T = L.steps, D = L.head_dim, C = L.channels;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const std::int64_t pairs = L.batch * L.heads;
  pipeline::detail::parallel_for_dynamic(pairs, head_threads(T, D), [&](std::int64_t bh, int) {
    const std::int64_t b = bh / L.heads, h = bh % L.heads;
    const std::int64_t row0 = b * T * in.in_stride + h * D;
    ConstStridedMap Q(in.q + row0, T, D, Eigen::OuterStride<>(in.in_stride));
    ConstStridedMap K(in.k + row0, T, D, Eigen::OuterStride<>(in.in_stride));
    ConstStridedMap V(in.v + row0, T, D, Eigen::OuterStride<>(in.in_stride));
    detail::MatrixMap P(probs + bh * T * T, T, T);
    StridedMap O(out + b * T * C + h * D, T, D, Eigen::OuterStride<>(C));
    detail::assign_product(P, Q, K.transpose(), scale);
    for (std::int64_t i = 0; i < T; ++i) {
      // Row i sees columns [0, i] when causal; max-subtraction keeps exp() in range.
      const std::int64_t n = causal ? i + 1 : T;
      auto row = P.row(i).head(n).array();
      row = (row - row.maxCoeff()).exp();
      row /= row.sum();
      if (n < T) P.row(i).tail(T - n).setZero();
    }
    detail::assign_product(O, P, V);
  });
}

void backward_impl(const Layout& L, const Operands& in, const float* probs, const float* dout,
                   const GradOperands& g) {
  const std::int64_t T = L.steps, D = L.head_dim, C = L.channels;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const std::int64_t pairs = L.batch * L.heads;
  const int threads = head_threads(T, D);
  std::vector<RowMatrix> scratch(static_cast<std::size_t>(threads));  // a thread's dP, then dS
  pipeline::detail::parallel_for_dynamic(pairs, threads, [&](std::int64_t bh, int t) {
    RowMatrix& dS = scratch[static_cast<std::size_t>(t)];
    dS.resize(T, T);
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

    detail::assign_product(dV, P.transpose(), dO);
    detail::assign_product(dS, dO, V.transpose());
    // Softmax backward per row; masked entries have P = 0 and so get dS = 0.
    auto rowdot = (dS.array() * P.array()).rowwise().sum().eval();
    dS.array() = P.array() * (dS.array().colwise() - rowdot);
    detail::assign_product(dQ, dS, K, scale);
    detail::assign_product(dK, dS.transpose(), Q, scale);
  });
}

#if PIPELINE_WITH_CUDA
// The fused kernels' limits, as errors that say what to change.
kernels::AttentionProblem cuda_problem(const char* op, const Layout& L, Device device,
                                       bool causal) {
  PIPELINE_CHECK_AS(ConfigError, L.head_dim <= kernels::kAttentionMaxHeadDim,
                    "{} on {}: head dim {} ({} channels / {} heads) exceeds the fused kernel's "
                    "{}; use more heads or run on the CPU",
                    op, device.str(), L.head_dim, L.channels, L.heads,
                    kernels::kAttentionMaxHeadDim);
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  PIPELINE_CHECK(L.steps <= kMax && L.batch * L.heads * ((L.steps + 63) / 64) <= kMax,
                 "{} on {}: {} sequences of {} steps with {} heads exceed the kernel's 2^31 - 1 "
                 "tiles; split the batch",
                 op, device.str(), L.batch, L.steps, L.heads);
  // Under a bf16 compute dtype the operands hold bf16 values: the tensor-core kernels.
  return {L.batch,
          L.steps,
          L.heads,
          L.head_dim,
          causal,
          compute_dtype() == DType::BFloat16,
          bf16_attention_kernel() != Bf16AttentionKernel::Wmma,
          bf16_attention_kernel() == Bf16AttentionKernel::MmaRounded};
}
#endif

}  // namespace

namespace {

Bf16AttentionKernel kernel_from_environment() {
  const char* v = std::getenv("PIPELINE_BF16_ATTENTION");
  const std::string_view name = v != nullptr ? v : "mma";
  if (name == "wmma") return Bf16AttentionKernel::Wmma;
  if (name == "mma-rounded") return Bf16AttentionKernel::MmaRounded;
  if (name != "mma")
    log_warn("PIPELINE_BF16_ATTENTION={} is none of mma, mma-rounded, wmma: mma it is", name);
  return Bf16AttentionKernel::Mma;
}

std::atomic<Bf16AttentionKernel> g_bf16_kernel{kernel_from_environment()};

// What the kernels read for q, k or v: product_operand (ops/precision.hpp), except a float32
// operand bound for the CUDA tensor-core kernels, which round to bf16 as they load it (the same
// values: a rounded copy would be one more pass over memory). dout stays product_operand: the
// backward's row dots read it from memory as it is.
Tensor qkv_operand(const Tensor& x) {
#if PIPELINE_WITH_CUDA
  if (x.device().is_cuda() && x.dtype() == DType::Float32 && compute_dtype() == DType::BFloat16) {
    const detail::CudaScope cuda(x.device());  // attention_bf16_supported asks the current device
    if (kernels::attention_bf16_supported()) return x;
  }
#endif
  return product_operand(x);
}

// Whether a packed qkv held in bf16 goes to the CUDA kernels as it is (half the bytes, no
// float32 copy): on a device and with a kernel choice that read bf16 (kernels::
// attention_reads_bf16); otherwise it is widened (qkv_operand).
bool reads_bf16_qkv(const char* op, const Tensor& qkv, std::int64_t heads, bool causal) {
#if PIPELINE_WITH_CUDA
  if (qkv.dtype() != DType::BFloat16 || !qkv.device().is_cuda() || qkv.rank() != 3 ||
      qkv.dim(2) % 3 != 0 || heads <= 0 || qkv.dim(2) / 3 % heads != 0 || qkv.numel() == 0)
    return false;
  const std::int64_t C = qkv.dim(2) / 3;
  const Layout L{qkv.dim(0), qkv.dim(1), C, heads, C / heads};
  const kernels::AttentionProblem pr = cuda_problem(op, L, qkv.device(), causal);
  const detail::CudaScope cuda(qkv.device());  // attention_bf16_supported asks the current device
  const std::uint16_t* p = qkv.device_data<std::uint16_t>();
  return kernels::attention_reads_bf16(pr, p, p + C, p + 2 * C, 3 * C);
#else
  (void)op, (void)qkv, (void)heads, (void)causal;
  return false;
#endif
}

// The packed qkv's shape, in float32 — or in bf16 where `bf16` (reads_bf16_qkv).
void check_packed(const char* op, const char* what, const Tensor& t, const Shape& want, bool bf16) {
  if (!bf16) return check_shape(op, what, t, want);
  PIPELINE_CHECK(t.shape() == want, "{}: {} must be {}, got {}", op, what, want, t.shape());
}

}  // namespace

void set_bf16_attention_kernel(Bf16AttentionKernel kernel) {
  g_bf16_kernel = kernel;
}

Bf16AttentionKernel bf16_attention_kernel() {
  return g_bf16_kernel;
}

Shape attention_saved_shape(Device device, std::int64_t batch, std::int64_t heads,
                            std::int64_t steps) {
  if (device.is_cuda()) return Shape{batch, heads, steps};
  return Shape{batch, heads, steps, steps};
}

void attention_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                       std::int64_t heads, Tensor& out, Tensor& saved, bool causal) {
  const Tensor q = qkv_operand(q_in), k = qkv_operand(k_in), v = qkv_operand(v_in);
  const char* op = "attention_forward";
  const Layout L = check_layout(op, q, heads);
  const Device device = op_device(op, {&q, &k, &v, &out, &saved});
  check_shape(op, "k", k, q.shape());
  check_shape(op, "v", v, q.shape());
  check_shape(op, "out", out, q.shape());
  check_shape(op, "saved", saved, attention_saved_shape(device, L.batch, heads, L.steps));
  if (q.numel() == 0) return;
#if PIPELINE_WITH_CUDA
  if (device.is_cuda()) {
    const kernels::AttentionProblem pr = cuda_problem(op, L, device, causal);
    const detail::CudaScope cuda(device);
    kernels::attention_forward(cuda.stream(), pr, q.device_data<float>(), k.device_data<float>(),
                               v.device_data<float>(), L.channels, out.device_data<float>(),
                               L.channels, saved.device_data<float>());
    return;
  }
#endif
  forward_impl(L, {q.data<float>(), k.data<float>(), v.data<float>(), L.channels},
               out.data<float>(), saved.data<float>(), causal);
}

void attention_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                        const Tensor& out, const Tensor& saved, const Tensor& dout_in,
                        std::int64_t heads, Tensor& dq, Tensor& dk, Tensor& dv, bool causal) {
  const Tensor q = qkv_operand(q_in), k = qkv_operand(k_in), v = qkv_operand(v_in),
               dout = product_operand(dout_in);
  const char* op = "attention_backward";
  const Layout L = check_layout(op, q, heads);
  const Device device = op_device(op, {&q, &k, &v, &out, &saved, &dout, &dq, &dk, &dv});
  for (auto [what, t] : {std::pair{"k", &k}, std::pair{"v", &v}, std::pair{"out", &out},
                         std::pair{"dout", &dout}, std::pair{"dq", static_cast<const Tensor*>(&dq)},
                         std::pair{"dk", static_cast<const Tensor*>(&dk)},
                         std::pair{"dv", static_cast<const Tensor*>(&dv)}})
    check_shape(op, what, *t, q.shape());
  check_shape(op, "saved", saved, attention_saved_shape(device, L.batch, heads, L.steps));
  if (q.numel() == 0) return;
#if PIPELINE_WITH_CUDA
  if (device.is_cuda()) {
    const kernels::AttentionProblem pr = cuda_problem(op, L, device, causal);
    const detail::CudaScope cuda(device);
    Tensor workspace = cuda.scratch_floats(kernels::attention_backward_workspace_floats(pr));
    kernels::attention_backward(
        cuda.stream(), pr, q.device_data<float>(), k.device_data<float>(), v.device_data<float>(),
        L.channels, out.device_data<float>(), dout.device_data<float>(), L.channels,
        saved.device_data<float>(), dq.device_data<float>(), dk.device_data<float>(),
        dv.device_data<float>(), L.channels, workspace.device_data<float>());
    return;
  }
#endif
  (void)causal;  // the CPU backward reads the mask from the saved probabilities
  backward_impl(L, {q.data<float>(), k.data<float>(), v.data<float>(), L.channels},
                saved.data<float>(), dout.data<float>(),
                {dq.data<float>(), dk.data<float>(), dv.data<float>(), L.channels});
}

void attention_forward_packed(const Tensor& qkv_in, std::int64_t heads, Tensor& out, Tensor& saved,
                              bool causal) {
  const char* op = "attention_forward_packed";
  const bool bf16 = reads_bf16_qkv(op, qkv_in, heads, causal);
  const Tensor qkv = bf16 ? qkv_in : qkv_operand(qkv_in);
  const Layout L = check_layout(op, out, heads);
  const Device device = op_device(op, {&qkv, &out, &saved});
  check_packed(op, "qkv", qkv, Shape{L.batch, L.steps, 3 * L.channels}, bf16);
  check_shape(op, "saved", saved, attention_saved_shape(device, L.batch, heads, L.steps));
  if (out.numel() == 0) return;
#if PIPELINE_WITH_CUDA
  if (device.is_cuda()) {
    const kernels::AttentionProblem pr = cuda_problem(op, L, device, causal);
    const detail::CudaScope cuda(device);
    const std::int64_t C = L.channels;
    const auto run = [&](const auto* p) {  // q, k, v side by side in each row
      kernels::attention_forward(cuda.stream(), pr, p, p + C, p + 2 * C, 3 * C,
                                 out.device_data<float>(), C, saved.device_data<float>());
    };
    if (bf16)
      run(qkv.device_data<std::uint16_t>());
    else
      run(qkv.device_data<float>());
    return;
  }
#endif
  const float* p = qkv.data<float>();
  forward_impl(L, {p, p + L.channels, p + 2 * L.channels, 3 * L.channels}, out.data<float>(),
               saved.data<float>(), causal);
}

void attention_backward_packed(const Tensor& qkv_in, const Tensor& out, const Tensor& saved,
                               const Tensor& dout_in, std::int64_t heads, Tensor& dqkv,
                               bool causal) {
  const char* op = "attention_backward_packed";
  const bool bf16 = reads_bf16_qkv(op, qkv_in, heads, causal);
  const Tensor qkv = bf16 ? qkv_in : qkv_operand(qkv_in), dout = product_operand(dout_in);
  const Layout L = check_layout(op, dout, heads);
  const Device device = op_device(op, {&qkv, &out, &saved, &dout, &dqkv});
  const Shape packed{L.batch, L.steps, 3 * L.channels};
  check_packed(op, "qkv", qkv, packed, bf16);
  check_shape(op, "dqkv", dqkv, packed);
  check_shape(op, "out", out, dout.shape());
  check_shape(op, "saved", saved, attention_saved_shape(device, L.batch, heads, L.steps));
  if (dout.numel() == 0) return;
#if PIPELINE_WITH_CUDA
  if (device.is_cuda()) {
    const kernels::AttentionProblem pr = cuda_problem(op, L, device, causal);
    const detail::CudaScope cuda(device);
    Tensor workspace = cuda.scratch_floats(kernels::attention_backward_workspace_floats(pr));
    const std::int64_t C = L.channels;
    float* d = dqkv.device_data<float>();
    const auto run = [&](const auto* p) {
      kernels::attention_backward(cuda.stream(), pr, p, p + C, p + 2 * C, 3 * C,
                                  out.device_data<float>(), dout.device_data<float>(), C,
                                  saved.device_data<float>(), d, d + C, d + 2 * C, 3 * C,
                                  workspace.device_data<float>());
    };
    if (bf16)
      run(qkv.device_data<std::uint16_t>());
    else
      run(qkv.device_data<float>());
    return;
  }
#endif
  (void)causal;  // the CPU backward reads the mask from the saved probabilities
  const float* p = qkv.data<float>();
  float* d = dqkv.data<float>();
  backward_impl(L, {p, p + L.channels, p + 2 * L.channels, 3 * L.channels}, saved.data<float>(),
                dout.data<float>(), {d, d + L.channels, d + 2 * L.channels, 3 * L.channels});
}

}  // namespace pipeline::ops
