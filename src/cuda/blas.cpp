#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/cuda/blas.hpp>
#include <pipeline/cuda/check.hpp>
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/cuda/stream.hpp>

#include "activation.cuh"
#include "alignment.hpp"
#include "bias.cuh"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

namespace pipeline::cuda {

namespace {

std::atomic<bool> g_allow_tf32{false};

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

// What decides the algorithm: shapes, strides, transposes, epilogue, compute type, beta != 0,
// operand type, result type, and the alignments of the two operands and of C.
using AlgoKey =
    std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
               bool, bool, int, bool, bool, int, int, std::uint32_t, std::uint32_t, std::uint32_t>;

// What an algorithm may count on: cuBLASLt's heuristic assumes 256 bytes unless told less, and a
// call on a less aligned view (a microbatch's rows, a tensor's slice) may then be refused.
std::uint32_t alignment_of(const void* p) {
  return static_cast<std::uint32_t>(detail::pointer_alignment(p, 256));
}

// One cuBLASLt handle, workspace and algorithm cache per device and thread (a stage thread of an
// in-process pipeline has its own, so nothing is shared between concurrent streams).
struct BlasContext {
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  // nullopt: cuBLASLt has no algorithm that fuses this key's epilogue (the product then runs
  // without it and the epilogue as its own pass).
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos;

  explicit BlasContext(int d) : device(d) {
    DeviceGuard guard(device);
    PIPELINE_CUBLAS_CHECK(cublasLtCreate(&handle));
    workspace = device_pool(device).allocate(kWorkspaceBytes, nullptr);
  }
  ~BlasContext() {
    // Thread exit: the pool keeps the workspace for reuse; the handle goes.
    if (workspace != nullptr) device_pool(device).deallocate(workspace);
    if (handle != nullptr) (void)cublasLtDestroy(handle);
  }
  BlasContext(const BlasContext&) = delete;
  BlasContext& operator=(const BlasContext&) = delete;
};

BlasContext& context(int device) {
  thread_local std::map<int, std::unique_ptr<BlasContext>> contexts;
  auto& c = contexts[device];
  if (!c) c = std::make_unique<BlasContext>(device);
  return *c;
}

// RAII for the descriptors of one call.
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~MatmulDesc() {
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};
struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~Layout() {
    if (layout) (void)cublasLtMatrixLayoutDestroy(layout);
  }
};
struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~Preference() {
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
  }
};

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

namespace {

// Once per process: a bf16 result that cuBLASLt does not write itself is computed in fp32 and
// rounded (the same values, one more pass over C), which a benchmark would otherwise show only as
// a missing gain.
void note_unfused_bf16(std::int64_t m, std::int64_t n, std::int64_t k, GemmEpilogue epilogue,
                       cublasStatus_t status) {
  static std::atomic<bool> noted{false};
  if (noted.exchange(true)) return;
  log_info(
      "cuBLASLt writes no bf16 result for a {}x{}x{} product{} on {} ({}): it and any "
      "such product are computed in fp32 and rounded",
      m, n, k, epilogue == GemmEpilogue::None ? "" : " with an fp32 bias epilogue",
      current_device_name(), cublasLtGetStatusName(status));
}

// C (`result_type`: fp32, or bf16 with beta 0) = alpha op(A) op(B) + beta C with A and B of
// `operands` type (fp32 or bf16); bf16 operands always accumulate in fp32, fp32 ones in TF32
// where allowed. A bf16 result for which cuBLASLt has no algorithm returns false with nothing
// queued; an fp32 one always runs (its epilogue as a pass of its own where it must).
bool gemm_any(cudaStream_t stream, int device, bool trans_a, bool trans_b, std::int64_t m,
              std::int64_t n, std::int64_t k, float alpha, cudaDataType_t operands, const void* a,
              std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c,
              cudaDataType_t result_type, std::int64_t ldc, GemmEpilogue epilogue,
              const float* bias) {
  if (m == 0 || n == 0) return true;
  PIPELINE_CHECK(result_type == CUDA_R_32F || beta == 0.f,
                 "gemm: a bf16 result is written, never accumulated into (beta {})", beta);
  PIPELINE_CHECK(epilogue == GemmEpilogue::None || bias != nullptr,
                 "gemm: a bias epilogue needs the bias");
  // The epilogue as its own pass (fp32 results only): the same numbers, one more pass over C.
  const auto unfused = [&] {
    if (result_type != CUDA_R_32F) return false;
    PIPELINE_CHECK(
        ldc == n, "gemm: an unfused bias epilogue needs a dense C ({} columns, stride {})", n, ldc);
    auto* c32 = static_cast<float*>(c);
    gemm_any(stream, device, trans_a, trans_b, m, n, k, alpha, operands, a, lda, b, ldb, beta, c,
             result_type, ldc, GemmEpilogue::None, nullptr);
    kernels::add_bias(stream, c32, bias, m, n);
    if (epilogue == GemmEpilogue::ReluBias)
      kernels::activation_forward(stream, kernels::ActivationKind::ReLU, c32, c32, m * n);
    return true;
  };
  // cuBLASLt takes no alignment preference for the bias, and an epilogue may read it in
  // vectors: a bias view off 16 bytes is added in a pass of its own.
  DeviceGuard guard(device);
  if (epilogue != GemmEpilogue::None && detail::pointer_alignment(bias, 16) < 16) return unfused();
  BlasContext& ctx = context(device);
  const bool tf32 = operands == CUDA_R_32F && g_allow_tf32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;

  // Column-major view: C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m). Row-major B (stored rows x
  // cols with stride ldb) is the column-major matrix B^T with leading dimension ldb, so the first
  // operand is B with B's transpose flag, the second A with A's.
  MatmulDesc op;
  PIPELINE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.desc, compute, CUDA_R_32F));
  const cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  PIPELINE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  PIPELINE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (epilogue != GemmEpilogue::None) {
    // The bias runs along the column-major output's rows: one value per n, as wanted.
    const cublasLtEpilogue_t e =
        epilogue == GemmEpilogue::Bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_RELU_BIAS;
    PIPELINE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
    PIPELINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof(bias)));
    // The bias is fp32 whatever the result's type (by default it would be the result's).
    const std::int32_t bias_type = CUDA_R_32F;
    PIPELINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        op.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // Stored shapes (column-major rows x cols) of the two operands and of C^T.
  Layout la, lb, lc;
  const std::uint64_t a_rows = trans_b ? static_cast<std::uint64_t>(k) : static_cast<std::uint64_t>(n);
  const std::uint64_t a_cols = trans_b ? static_cast<std::uint64_t>(n) : static_cast<std::uint64_t>(k);
  const std::uint64_t b_rows = trans_a ? static_cast<std::uint64_t>(m) : static_cast<std::uint64_t>(k);
  const std::uint64_t b_cols = trans_a ? static_cast<std::uint64_t>(k) : static_cast<std::uint64_t>(m);
  PIPELINE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.layout, operands, a_rows, a_cols, ldb));
  PIPELINE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.layout, operands, b_rows, b_cols, lda));
  PIPELINE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &lc.layout, result_type, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), ldc));

  const AlgoKey key{m,
                    n,
                    k,
                    lda,
                    ldb,
                    ldc,
                    trans_a,
                    trans_b,
                    static_cast<int>(epilogue),
                    tf32,
                    beta != 0.f,
                    static_cast<int>(operands),
                    static_cast<int>(result_type),
                    alignment_of(b),
                    alignment_of(a),
                    alignment_of(c)};
  auto it = ctx.algos.find(key);
  if (it == ctx.algos.end()) {
    Preference pref;
    PIPELINE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.pref));
    const std::size_t workspace = kWorkspaceBytes;
    PIPELINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    // cuBLASLt's A is our B and its B our A (the column-major view above); C and D are C.
    const std::uint32_t aligned[] = {std::get<13>(key), std::get<14>(key), std::get<15>(key),
                                     std::get<15>(key)};
    const cublasLtMatmulPreferenceAttributes_t which[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      PIPELINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.pref, which[i], &aligned[i],
                                                                 sizeof(aligned[i])));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(ctx.handle, op.desc, la.layout, lb.layout, lc.layout,
                                       lc.layout, pref.pref, 1, &result, &found);
    if ((epilogue != GemmEpilogue::None || result_type != CUDA_R_32F) &&
        (status != CUBLAS_STATUS_SUCCESS || found == 0)) {
      it = ctx.algos.emplace(key, std::nullopt).first;
      if (result_type != CUDA_R_32F) note_unfused_bf16(m, n, k, epilogue, status);
    } else {
      PIPELINE_CUBLAS_CHECK(status);
      PIPELINE_CHECK_AS(CudaError, found > 0,
                        "cuBLASLt has no algorithm for a {}x{}x{} {} product (transposes {}/{}) "
                        "on {}",
                        m, n, k, operands == CUDA_R_16BF ? "bf16" : "fp32", trans_a, trans_b,
                        current_device_name());
      it = ctx.algos.emplace(key, result.algo).first;
    }
  }
  if (!it->second) return unfused();
  // k == 0 is a valid product: the result is beta C (plus the epilogue).
  const cublasStatus_t run =
      cublasLtMatmul(ctx.handle, op.desc, &alpha, b, la.layout, a, lb.layout, &beta, c, lc.layout,
                     c, lc.layout, &*it->second, ctx.workspace, kWorkspaceBytes, stream);
  if (run == CUBLAS_STATUS_NOT_SUPPORTED && result_type != CUDA_R_32F) {
    // An algorithm the heuristic offered and the call refused (nothing queued): the caller
    // computes this key in fp32 and rounds from now on.
    it->second = std::nullopt;
    note_unfused_bf16(m, n, k, epilogue, run);
    return false;
  }
  PIPELINE_CUBLAS_CHECK(run);
  return true;
}

}  // namespace

void prepare_blas(int device) {
  (void)context(device);
}

void gemm_f32(cudaStream_t stream, int device, bool trans_a, bool trans_b, std::int64_t m,
              std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
              const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc,
              GemmEpilogue epilogue, const float* bias) {
  gemm_any(stream, device, trans_a, trans_b, m, n, k, alpha, CUDA_R_32F, a, lda, b, ldb, beta, c,
           CUDA_R_32F, ldc, epilogue, bias);
}

void gemm_bf16(cudaStream_t stream, int device, bool trans_a, bool trans_b, std::int64_t m,
               std::int64_t n, std::int64_t k, float alpha, const std::uint16_t* a,
               std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, GemmEpilogue epilogue, const float* bias) {
  gemm_any(stream, device, trans_a, trans_b, m, n, k, alpha, CUDA_R_16BF, a, lda, b, ldb, beta, c,
           CUDA_R_32F, ldc, epilogue, bias);
}

bool gemm_bf16_out(cudaStream_t stream, int device, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, float alpha, const std::uint16_t* a,
                   std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, std::uint16_t* c,
                   std::int64_t ldc, GemmEpilogue epilogue, const float* bias) {
  return gemm_any(stream, device, trans_a, trans_b, m, n, k, alpha, CUDA_R_16BF, a, lda, b, ldb,
                  0.f, c, CUDA_R_16BF, ldc, epilogue, bias);
}

}  // namespace pipeline::cuda
