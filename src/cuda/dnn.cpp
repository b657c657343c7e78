#include <pipeline/core/error.hpp>
#include <pipeline/cuda/blas.hpp>
#include <pipeline/cuda/check.hpp>
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/cuda/dnn.hpp>
#include <pipeline/cuda/dnn_graph.hpp>
#include <pipeline/cuda/graph.hpp>
#include <pipeline/cuda/stream.hpp>

#include "alignment.hpp"
#include "call_workspace.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string_view>

// The legacy convolution API is deprecated in cuDNN 9 (see dnn.hpp): silence the attribute here,
// where every use of it lives, in case a build defines CUDNN_WARN_DEPRECATED.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

namespace pipeline::cuda {

namespace {

std::atomic<bool> g_deterministic{true};
// PIPELINE_CONV_TRANSFORMED=1 starts the process with transformed_convolutions() on.
std::atomic<bool> g_transformed{[] {
  const char* v = std::getenv("PIPELINE_CONV_TRANSFORMED");
  return v != nullptr && std::string_view(v) == "1";
}()};
// PIPELINE_CUDA_CONV_DIRECT=1 or 0 starts the process with offered kernels always or never taken.
std::atomic<DirectConvolutions> g_direct{[] {
  const std::string_view v = std::getenv("PIPELINE_CUDA_CONV_DIRECT") != nullptr
                                 ? std::getenv("PIPELINE_CUDA_CONV_DIRECT")
                                 : "";
  return v == "1"   ? DirectConvolutions::Always
         : v == "0" ? DirectConvolutions::Never
                    : DirectConvolutions::Timed;
}()};

// The largest workspace an algorithm search offers the candidates: enough for every
// implicit-gemm and Winograd algorithm of the zoo's models; FFT variants wanting more are
// skipped rather than allowed to take most of the device.
constexpr std::size_t kMaxSearchWorkspace = std::size_t{1} << 30;
constexpr std::size_t kMinSearchWorkspace = std::size_t{16} << 20;

enum class Pass : int { Forward = 0, BackwardData = 1, BackwardFilter = 2 };
constexpr const char* kPassNames[] = {"forward", "backward-data", "backward-filter"};

// Everything the choice depends on: pass, the problem, the math mode, determinism, whether
// every pointer is 16-byte aligned (a tensor view may start anywhere; some kernels need more),
// and whether a kernel of the caller's was timed beside cuDNN's.
using AlgoKey = std::array<int, 18>;

struct AlgoChoice {
  int algo = 0;
  std::size_t workspace = 0;
  bool direct = false;  // the caller's kernel measured faster than any algorithm
};

// One cuDNN handle and algorithm cache per device and thread.
struct DnnContext {
  int device = 0;
  cudnnHandle_t handle = nullptr;
  std::map<AlgoKey, AlgoChoice> algos;

  explicit DnnContext(int d) : device(d) {
    DeviceGuard guard(device);
    PIPELINE_CUDNN_CHECK(cudnnCreate(&handle));
  }
  ~DnnContext() {
    if (handle != nullptr) (void)cudnnDestroy(handle);
  }
  DnnContext(const DnnContext&) = delete;
  DnnContext& operator=(const DnnContext&) = delete;
};

DnnContext& context(int device) {
  thread_local std::map<int, std::unique_ptr<DnnContext>> contexts;
  auto& c = contexts[device];
  if (!c) c = std::make_unique<DnnContext>(device);
  return *c;
}

using Workspace = detail::CallWorkspace;

// The search's workspace: the most any candidate asks for (capped), halved while the device
// cannot give it; down to none at all, when only workspace-free algorithms take part.
std::unique_ptr<Workspace> search_workspace(int device, std::size_t wanted, cudaStream_t stream) {
  std::size_t bytes = std::min(wanted, kMaxSearchWorkspace);
  while (bytes > 0) {
    try {
      return std::make_unique<Workspace>(device, bytes, stream);
    } catch (const CudaError&) {
      bytes = bytes > kMinSearchWorkspace ? bytes / 2 : 0;
    }
  }
  return std::make_unique<Workspace>(device, 0, stream);
}

bool aligned16(const void* p) {
  return detail::pointer_alignment(p, 16) == 16;
}

AlgoKey make_key(Pass pass, const Conv2dProblem& p, bool bf16_operands, bool tf32, bool det,
                 bool exact, bool aligned, bool direct_timed) {
  AlgoKey key{};
  const auto shape = p.fields();
  auto at = std::copy(shape.begin(), shape.end(), key.begin());
  for (const bool flag : {bf16_operands, tf32, det, exact, aligned, direct_timed})
    *at++ = flag ? 1 : 0;
  *at = static_cast<int>(pass);
  return key;
}

// Algorithms that compute in a transformed domain (FFT, non-fused Winograd): their rounding is
// far from fp32's (relative errors near 1e-3 on fashion-cnn's 5x5 convolution, measured on an
// H100), so exact fp32 (TF32 off, transformed_convolutions() off) never takes them.
bool transformed(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transformed(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transformed(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// The first (fastest) usable result: it ran (or, from the heuristics, is supported), it is
// deterministic when that is asked for, exact when that is asked for, and its workspace fits
// `limit`.
template <typename Perf>
const Perf* pick(const Perf* perf, int count, bool det, bool exact, std::size_t limit) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS) continue;
    if (det && r.determinism != CUDNN_DETERMINISTIC) continue;
    if (exact && transformed(r.algo)) continue;
    if (r.memory > limit) continue;
    return &r;
  }
  return nullptr;
}

// The descriptors of one call.
struct ConvDescriptors {
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;

  // fp32 elements; on the tensor cores (CUDNN_DEFAULT_MATH, TF32) only when `tensor_cores`.
  ConvDescriptors(const Conv2dProblem& p, bool tensor_cores)
      : x(p.n, p.c, p.h, p.w),
        y(p.n, p.m, p.out_h(), p.out_w()),
        w(p.m, p.c, p.kh, p.kw),
        conv(p.pad_h, p.pad_w, p.stride_h, p.stride_w,
             tensor_cores ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) {}
};

[[noreturn]] void no_algorithm(Pass pass, const Conv2dProblem& p, bool det) {
  PIPELINE_FAIL(CudaError,
                "cuDNN has no {}{} algorithm for the convolution of [{}, {}, {}, {}] by [{}, {}, "
                "{}, {}] (stride {}x{}, padding {}x{}) on {}{}",
                det ? "deterministic " : "", kPassNames[static_cast<int>(pass)], p.n, p.c, p.h, p.w,
                p.m, p.c, p.kh, p.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w,
                current_device_name(),
                det ? ": cuda::set_deterministic(false) admits the non-deterministic ones" : "");
}

// Milliseconds one call of `run` takes on `stream`: the mean of three in a row, after one untimed
// call (the best of several would favour the caller's kernel over cuDNN's one figure for each of
// its algorithms).
float time_ms(int device, cudaStream_t stream, const std::function<void()>& run) {
  constexpr int kCalls = 3;
  run();
  Event start = Event::create(device, true), end = Event::create(device, true);
  start.record(stream);
  for (int i = 0; i < kCalls; ++i) run();
  end.record(stream);
  end.synchronize();
  return Event::elapsed_ms(start, end) / kCalls;
}

// What `choose` times of the caller's kernel under `mode` (nothing unless Timed): a call into
// `out` itself where it is overwritten (beta 0), else into a scratch output of `out_bytes`, as
// cuDNN's search does, so that an accumulated result is not touched.
std::function<float()> timed_direct(DirectConvolutions mode, const ConvKernel& direct, int device,
                                    cudaStream_t stream, float beta, float* out,
                                    std::size_t out_bytes) {
  if (mode != DirectConvolutions::Timed) return {};
  return [&direct, device, stream, beta, out, out_bytes] {
    const Workspace scratch(device, beta != 0.f ? out_bytes : 0, stream);
    float* target = beta != 0.f ? static_cast<float*>(scratch.get()) : out;
    return time_ms(device, stream, [&] { direct(0.f, target); });
  };
}

// The algorithm of `key`, searched for once. Sizes(algo, &bytes) asks one algorithm's workspace;
// Find(ws, bytes, perf, &returned) times the candidates; Heuristic(perf, &returned) ranks them
// without running anything (the fallback when no timed candidate is usable). `time_direct`,
// where given, times the caller's kernel (ms), which wins over a slower timed algorithm and over
// algorithms that were not timed. Inside a CUDA graph capture nothing may wait for the device:
// a problem first met there takes the heuristics' ranking, untimed and not cached (an eager call
// of it later searches as usual), where a timed search would have failed the capture. The
// heuristics do not see the pointers: with an operand off 16 bytes (`aligned` false) a capture
// takes algorithm 0 of the pass (implicit GEMM), which reads operands at any alignment, where
// it qualifies.
template <typename Perf, int Count, typename Sizes, typename Find, typename Heuristic>
AlgoChoice choose(DnnContext& ctx, const AlgoKey& key, Pass pass, const Conv2dProblem& p, bool det,
                  bool exact, bool aligned, cudaStream_t stream, Sizes sizes, Find find,
                  Heuristic heuristic, const std::function<float()>& time_direct) {
  if (auto it = ctx.algos.find(key); it != ctx.algos.end()) return it->second;
  const bool capture = capturing(stream);
  std::size_t wanted = 0;
  for (int a = 0; a < Count; ++a) {
    std::size_t bytes = 0;
    if (sizes(a, &bytes) == CUDNN_STATUS_SUCCESS && bytes <= kMaxSearchWorkspace)
      wanted = std::max(wanted, bytes);
  }
  std::array<Perf, Count> perf{};
  int returned = 0;
  const Perf* best = nullptr;
  if (!capture) {
    const auto ws = search_workspace(ctx.device, wanted, stream);
    PIPELINE_CUDNN_CHECK(find(ws->get(), ws->bytes(), perf.data(), &returned));
    best = pick(perf.data(), returned, det, exact, ws->bytes());
  }
  if (!capture && time_direct && (best == nullptr || time_direct() < best->time)) {
    const AlgoChoice choice{0, 0, true};
    ctx.algos.emplace(key, choice);
    return choice;
  }
  if (best == nullptr) {
    PIPELINE_CUDNN_CHECK(heuristic(perf.data(), &returned));
    const std::size_t any = std::numeric_limits<std::size_t>::max();
    best = pick(perf.data(), returned, det, exact, any);
    if (capture && !aligned)
      for (int i = 0; i < returned; ++i)
        if (static_cast<int>(perf[static_cast<std::size_t>(i)].algo) == 0 &&
            pick(&perf[static_cast<std::size_t>(i)], 1, det, exact, any) != nullptr)
          best = &perf[static_cast<std::size_t>(i)];
  }
  if (best == nullptr) no_algorithm(pass, p, det);
  AlgoChoice choice{static_cast<int>(best->algo), best->memory};
  // The reported memory has been known to fall short of what the call checks for: ask again.
  std::size_t bytes = 0;
  PIPELINE_CUDNN_CHECK(sizes(choice.algo, &bytes));
  choice.workspace = std::max(choice.workspace, bytes);
  if (!capture) ctx.algos.emplace(key, choice);
  return choice;
}

// What every pass does first: the device, the handle on the stream, the modes.
struct CallSetup {
  DeviceGuard guard;
  DnnContext& ctx;
  cudnnHandle_t handle;
  bool tf32, det, transformed;

  CallSetup(int device, cudaStream_t stream)
      : guard(device),
        ctx(context(device)),
        handle(ctx.handle),
        tf32(allow_tf32()),
        det(g_deterministic),
        transformed(g_transformed) {
    PIPELINE_CUDNN_CHECK(cudnnSetStream(handle, stream));
  }
};

}  // namespace

void set_deterministic(bool deterministic) {
  g_deterministic = deterministic;
}
bool deterministic() {
  return g_deterministic;
}

void set_direct_convolutions(DirectConvolutions mode) {
  g_direct = mode;
}
DirectConvolutions direct_convolutions() {
  return g_direct;
}

void set_transformed_convolutions(bool allow) {
  g_transformed = allow;
}
bool transformed_convolutions() {
  return g_transformed;
}

cudnnHandle_t dnn_handle(int device, cudaStream_t stream) {
  DnnContext& ctx = context(device);
  PIPELINE_CUDNN_CHECK(cudnnSetStream(ctx.handle, stream));
  return ctx.handle;
}

TensorDescriptor::TensorDescriptor(int n, int c, int h, int w, cudnnDataType_t type) {
  PIPELINE_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(m_desc.get(), CUDNN_TENSOR_NCHW, type, n, c, h, w));
}

FilterDescriptor::FilterDescriptor(int k, int c, int h, int w, cudnnDataType_t type) {
  PIPELINE_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(m_desc.get(), type, CUDNN_TENSOR_NCHW, k, c, h, w));
}

ConvolutionDescriptor::ConvolutionDescriptor(int pad_h, int pad_w, int stride_h, int stride_w,
                                             cudnnMathType_t math) {
  PIPELINE_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(m_desc.get(), pad_h, pad_w, stride_h,
                                                       stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                       CUDNN_DATA_FLOAT));
  PIPELINE_CUDNN_CHECK(cudnnSetConvolutionMathType(m_desc.get(), math));
}

namespace {

// The three passes over float32 elements. `bf16_operands`: the operands hold bf16 values (a bf16
// compute dtype rounded them), which TF32 represents exactly, so the tensor cores compute the
// bf16 products exactly, accumulated in fp32, whatever allow_tf32() says. (cuDNN's own bf16
// NCHW convolutions through this API measured 6x slower than TF32 ones on vgg16, H100.)
void forward_pass(cudaStream_t stream, int device, const Conv2dProblem& p, bool bf16_operands,
                  const void* x, const void* weight, float beta, void* y,
                  const ConvKernel& direct) {
  if (p.n == 0) return;
  // (A forward kernel writes its output: offered where nothing is accumulated into it.)
  const DirectConvolutions mode =
      direct && beta == 0.f ? g_direct.load() : DirectConvolutions::Never;
  if (mode == DirectConvolutions::Always) return direct(beta, static_cast<float*>(y));
  CallSetup s(device, stream);
  const bool tensor_cores = s.tf32 || bf16_operands;
  const ConvDescriptors d(p, tensor_cores);
  const bool exact = !tensor_cores && !s.transformed;
  const bool aligned = aligned16(x) && aligned16(weight) && aligned16(y);
  const AlgoKey key = make_key(Pass::Forward, p, bf16_operands, tensor_cores, s.det, exact, aligned,
                               mode == DirectConvolutions::Timed);
  const std::size_t y_bytes = sizeof(float) * static_cast<std::size_t>(p.n) *
                              static_cast<std::size_t>(p.m) * static_cast<std::size_t>(p.out_h()) *
                              static_cast<std::size_t>(p.out_w());
  const AlgoChoice choice = choose<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
      s.ctx, key, Pass::Forward, p, s.det, exact, aligned, stream,
      [&](int a, std::size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(
            s.handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
            static_cast<cudnnConvolutionFwdAlgo_t>(a), bytes);
      },
      [&](void* ws, std::size_t ws_bytes, cudnnConvolutionFwdAlgoPerf_t* perf, int* returned) {
        // The search writes its output: into y itself when y is overwritten anyway.
        const Workspace out(device, beta != 0.f ? y_bytes : 0, stream);
        void* target = beta != 0.f ? out.get() : y;
        return cudnnFindConvolutionForwardAlgorithmEx(
            s.handle, d.x.get(), x, d.w.get(), weight, d.conv.get(), d.y.get(), target,
            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, returned, perf, ws, ws_bytes);
      },
      [&](cudnnConvolutionFwdAlgoPerf_t* perf, int* returned) {
        return cudnnGetConvolutionForwardAlgorithm_v7(s.handle, d.x.get(), d.w.get(), d.conv.get(),
                                                      d.y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                      returned, perf);
      },
      timed_direct(mode, direct, device, stream, beta, static_cast<float*>(y), y_bytes));
  if (choice.direct) return direct(beta, static_cast<float*>(y));
  const Workspace ws(device, choice.workspace, stream);
  const float alpha = 1.f;
  PIPELINE_CUDNN_CHECK(cudnnConvolutionForward(s.handle, &alpha, d.x.get(), x, d.w.get(), weight,
                                               d.conv.get(),
                                               static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo),
                                               ws.get(), ws.bytes(), &beta, d.y.get(), y));
}

void backward_data_pass(cudaStream_t stream, int device, const Conv2dProblem& p, bool bf16_operands,
                        const void* dy, const void* weight, float beta, void* dx) {
  if (p.n == 0) return;
  CallSetup s(device, stream);
  const bool tensor_cores = s.tf32 || bf16_operands;
  const ConvDescriptors d(p, tensor_cores);
  const bool exact = !tensor_cores && !s.transformed;
  const bool aligned = aligned16(dy) && aligned16(weight) && aligned16(dx);
  const AlgoKey key =
      make_key(Pass::BackwardData, p, bf16_operands, tensor_cores, s.det, exact, aligned, false);
  const std::size_t dx_bytes = sizeof(float) * static_cast<std::size_t>(p.n) *
                               static_cast<std::size_t>(p.c) * static_cast<std::size_t>(p.h) *
                               static_cast<std::size_t>(p.w);
  const AlgoChoice choice =
      choose<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
          s.ctx, key, Pass::BackwardData, p, s.det, exact, aligned, stream,
          [&](int a, std::size_t* bytes) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(
                s.handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                static_cast<cudnnConvolutionBwdDataAlgo_t>(a), bytes);
          },
          [&](void* ws, std::size_t ws_bytes, cudnnConvolutionBwdDataAlgoPerf_t* perf,
              int* returned) {
            const Workspace out(device, beta != 0.f ? dx_bytes : 0, stream);
            void* target = beta != 0.f ? out.get() : dx;
            return cudnnFindConvolutionBackwardDataAlgorithmEx(
                s.handle, d.w.get(), weight, d.y.get(), dy, d.conv.get(), d.x.get(), target,
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, returned, perf, ws, ws_bytes);
          },
          [&](cudnnConvolutionBwdDataAlgoPerf_t* perf, int* returned) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(
                s.handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, returned, perf);
          },
          {});
  const Workspace ws(device, choice.workspace, stream);
  const float alpha = 1.f;
  PIPELINE_CUDNN_CHECK(
      cudnnConvolutionBackwardData(s.handle, &alpha, d.w.get(), weight, d.y.get(), dy, d.conv.get(),
                                   static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo),
                                   ws.get(), ws.bytes(), &beta, d.x.get(), dx));
}

void backward_filter_pass(cudaStream_t stream, int device, const Conv2dProblem& p,
                          bool bf16_operands, const void* x, const void* dy, float beta,
                          void* dweight, const ConvKernel& direct) {
  if (p.n == 0) return;
  const DirectConvolutions mode = direct ? g_direct.load() : DirectConvolutions::Never;
  if (mode == DirectConvolutions::Always) return direct(beta, static_cast<float*>(dweight));
  CallSetup s(device, stream);
  const bool tensor_cores = s.tf32 || bf16_operands;
  const ConvDescriptors d(p, tensor_cores);
  const bool exact = !tensor_cores && !s.transformed;
  const bool aligned = aligned16(x) && aligned16(dy) && aligned16(dweight);
  const AlgoKey key = make_key(Pass::BackwardFilter, p, bf16_operands, tensor_cores, s.det, exact,
                               aligned, mode == DirectConvolutions::Timed);
  const std::size_t dw_bytes = sizeof(float) * static_cast<std::size_t>(p.m) *
                               static_cast<std::size_t>(p.c) * static_cast<std::size_t>(p.kh) *
                               static_cast<std::size_t>(p.kw);
  const AlgoChoice choice =
      choose<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
          s.ctx, key, Pass::BackwardFilter, p, s.det, exact, aligned, stream,
          [&](int a, std::size_t* bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                s.handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                static_cast<cudnnConvolutionBwdFilterAlgo_t>(a), bytes);
          },
          [&](void* ws, std::size_t ws_bytes, cudnnConvolutionBwdFilterAlgoPerf_t* perf,
              int* returned) {
            // Weight gradients accumulate: the search must not write the real one.
            const Workspace out(device, beta != 0.f ? dw_bytes : 0, stream);
            void* target = beta != 0.f ? out.get() : dweight;
            return cudnnFindConvolutionBackwardFilterAlgorithmEx(
                s.handle, d.x.get(), x, d.y.get(), dy, d.conv.get(), d.w.get(), target,
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, returned, perf, ws, ws_bytes);
          },
          [&](cudnnConvolutionBwdFilterAlgoPerf_t* perf, int* returned) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                s.handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, returned, perf);
          },
          timed_direct(mode, direct, device, stream, beta, static_cast<float*>(dweight), dw_bytes));
  if (choice.direct) return direct(beta, static_cast<float*>(dweight));
  const Workspace ws(device, choice.workspace, stream);
  const float alpha = 1.f;
  PIPELINE_CUDNN_CHECK(
      cudnnConvolutionBackwardFilter(s.handle, &alpha, d.x.get(), x, d.y.get(), dy, d.conv.get(),
                                     static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo),
                                     ws.get(), ws.bytes(), &beta, d.w.get(), dweight));
}

}  // namespace

// float32 convolutions take cuDNN's graph API when asked for (dnn_graph.hpp: All); the legacy
// API where they are not, where that API has no engine, and for bf16 operands (the graph path's
// own fallback).
namespace {
bool graph_f32(bool bf16_operands) {
  return !bf16_operands && graph_convolutions() == GraphConvolutions::All;
}
}  // namespace

void conv2d_forward_f32(cudaStream_t stream, int device, const Conv2dProblem& p, const float* x,
                        const float* weight, float beta, float* y, bool bf16_operands,
                        const ConvKernel& direct) {
  if (graph_f32(bf16_operands) && conv2d_forward_graph_f32(stream, device, p, x, weight, beta, y))
    return;
  forward_pass(stream, device, p, bf16_operands, x, weight, beta, y, direct);
}
void conv2d_backward_data_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                              const float* dy, const float* weight, float beta, float* dx,
                              bool bf16_operands) {
  if (graph_f32(bf16_operands) &&
      conv2d_backward_data_graph_f32(stream, device, p, dy, weight, beta, dx))
    return;
  backward_data_pass(stream, device, p, bf16_operands, dy, weight, beta, dx);
}
void conv2d_backward_filter_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                                const float* x, const float* dy, float beta, float* dweight,
                                bool bf16_operands, const ConvKernel& direct) {
  if (graph_f32(bf16_operands) &&
      conv2d_backward_filter_graph_f32(stream, device, p, x, dy, beta, dweight))
    return;
  backward_filter_pass(stream, device, p, bf16_operands, x, dy, beta, dweight, direct);
}

}  // namespace pipeline::cuda
