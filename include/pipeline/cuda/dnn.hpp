// Convolutions on the GPU through cuDNN: the CUDA side of ops::conv2d_*, and the cuDNN handle and
// descriptor wrappers any other cuDNN-backed op builds on.
//
// Context. Every thread has, per device, one cudnnHandle_t (made on first use, destroyed when the
// thread ends) and a cache of chosen algorithms; each call binds the handle to the stream it is
// given (cudnnSetStream), so a stage thread of an in-process pipeline shares nothing with another.
//
// Algorithms. The algorithm of each problem (pass, all shapes, strides, padding, math mode,
// determinism, pointer alignment) is chosen once, by cudnnFind*AlgorithmEx — cuDNN times every
// candidate on the real inputs, with scratch outputs where the real one must not be touched (an
// accumulating backward-filter) — and cached; the fastest successful candidate wins. The timing
// run blocks the host once per new shape, like PyTorch's cudnn.benchmark. Workspaces, for the
// search and for every call, come from the stream-ordered caching allocator and are given back
// right after the call is queued.
//
// Determinism. Some cuDNN algorithms (backward-data ALGO_0, backward-filter ALGO_0 and ALGO_3)
// add partial results with atomics, so two runs on the same input may differ in the last bits.
// set_deterministic(true), the default, restricts the choice to algorithms cuDNN reports as
// CUDNN_DETERMINISTIC, so a run is reproducible bit for bit on one GPU; set_deterministic(false)
// takes the fastest of all (PyTorch's torch.backends.cudnn.deterministic = False).
//
// Precision. fp32 inputs, outputs and accumulation. TF32 follows cuda::allow_tf32() (blas.hpp):
// off, the convolution descriptor's math type is CUDNN_FMA_MATH (no tensor cores) and the
// algorithms that compute in a transformed domain (FFT, non-fused Winograd) are excluded unless
// set_transformed_convolutions(true), so results match the CPU to fp32 rounding; on,
// CUDNN_DEFAULT_MATH, which lets cuDNN round inputs to TF32 on Ampere and later (PyTorch's
// torch.backends.cudnn.allow_tf32), and every algorithm. Operands that hold bf16 values run on the
// tensor cores (bf16_operands below); bf16 tensors go through cuDNN's graph API instead
// (dnn_graph.hpp), with this as their fallback.
//
// cuDNN 9 keeps its "legacy" convolution API (descriptors, cudnnConvolution*) beside the graph
// API and marks it deprecated; the attribute only fires when CUDNN_WARN_DEPRECATED is defined.
// The API is stable and is what this layer needs (fixed NCHW fp32 convolutions), so its uses are
// fenced with a local -Wdeprecated-declarations pragma, should a build define that macro.
// Requires the CUDA toolkit and cuDNN (PIPELINE_WITH_CUDA builds only).
#pragma once

#include <pipeline/cuda/check.hpp>

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <functional>
#include <utility>

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

namespace pipeline::cuda {

// Whether cuDNN algorithms are restricted to deterministic ones (process-wide; default true).
void set_deterministic(bool deterministic);
bool deterministic();

// Whether float32 convolutions with TF32 off may take the algorithms that compute in a
// transformed domain (FFT, non-fused Winograd), as PyTorch's cudnn.benchmark does: much faster on
// some shapes (VGG-16's 3x3 layers), with relative errors near 1e-3 instead of fp32's rounding.
// Process-wide; off by default, on from the start with PIPELINE_CONV_TRANSFORMED=1.
void set_transformed_convolutions(bool allow);
bool transformed_convolutions();

// A kernel of the caller's for one pass of one problem: out = pass(...) + beta · out, queued on
// the pass's stream, on the pass's inputs. Offered to a pass (below), it is one more candidate of
// that problem's algorithm choice, timed on the same inputs as cuDNN's algorithms and taken where
// it was faster (the op's direct kernels for shallow windows, kernels/conv_direct.cuh). A forward
// kernel is offered only where beta is 0 (the op's write their output).
using ConvKernel = std::function<void(float beta, float* out)>;

// Whether kernels offered to a pass are timed against cuDNN's algorithms (Timed, the default),
// always taken (Always) or never (Never); process-wide. PIPELINE_CUDA_CONV_DIRECT=1 or 0 starts
// a process at Always or Never (the A/B of bench/gpu_checks.sh; the tests set each).
enum class DirectConvolutions { Timed, Always, Never };
void set_direct_convolutions(DirectConvolutions mode);
DirectConvolutions direct_convolutions();

// The calling thread's cuDNN handle on `device` (made on first use), bound to `stream`. The
// device must be current (DeviceGuard).
cudnnHandle_t dnn_handle(int device, cudaStream_t stream);

namespace detail {
// Owns one cuDNN descriptor: created on construction, destroyed with the object (never throws).
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class DnnDescriptor {
 public:
  DnnDescriptor() { PIPELINE_CUDNN_CHECK(Create(&m_desc)); }  // CudaError on failure
  DnnDescriptor(DnnDescriptor&& o) noexcept : m_desc(std::exchange(o.m_desc, nullptr)) {}
  DnnDescriptor& operator=(DnnDescriptor&& o) noexcept {
    if (this != &o) {
      reset();
      m_desc = std::exchange(o.m_desc, nullptr);
    }
    return *this;
  }
  DnnDescriptor(const DnnDescriptor&) = delete;
  DnnDescriptor& operator=(const DnnDescriptor&) = delete;
  ~DnnDescriptor() { reset(); }
  T get() const { return m_desc; }

 private:
  void reset() noexcept {
    if (m_desc != nullptr) (void)Destroy(m_desc);
    m_desc = nullptr;
  }
  T m_desc = nullptr;
};
}  // namespace detail

// A packed NCHW tensor [n, c, h, w] of float32 (or `type`) elements.
class TensorDescriptor {
 public:
  TensorDescriptor(int n, int c, int h, int w, cudnnDataType_t type = CUDNN_DATA_FLOAT);
  cudnnTensorDescriptor_t get() const { return m_desc.get(); }

 private:
  detail::DnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                        cudnnDestroyTensorDescriptor>
      m_desc;
};

// A filter bank of float32 (or `type`) elements in PyTorch's layout [out k, in c, h, w] (NCHW).
class FilterDescriptor {
 public:
  FilterDescriptor(int k, int c, int h, int w, cudnnDataType_t type = CUDNN_DATA_FLOAT);
  cudnnFilterDescriptor_t get() const { return m_desc.get(); }

 private:
  detail::DnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                        cudnnDestroyFilterDescriptor>
      m_desc;
};

// A 2-D cross-correlation (PyTorch's convolution) with zero padding, dilation 1, one group,
// fp32 compute, and the given math type.
class ConvolutionDescriptor {
 public:
  ConvolutionDescriptor(int pad_h, int pad_w, int stride_h, int stride_w, cudnnMathType_t math);
  cudnnConvolutionDescriptor_t get() const { return m_desc.get(); }

 private:
  detail::DnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                        cudnnDestroyConvolutionDescriptor>
      m_desc;
};

// One 2-D convolution problem: input [n, c, h, w], weight [m, c, kh, kw], output
// [n, m, out_h(), out_w()]. Every extent fits an int (the op checks it: cuDNN's legacy API takes
// ints).
struct Conv2dProblem {
  int n = 0, c = 0, h = 0, w = 0;
  int m = 0, kh = 0, kw = 0;
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int out_h() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  int out_w() const { return (w + 2 * pad_w - kw) / stride_w + 1; }
  // Every field, in the order above (for the keys of cached choices).
  std::array<int, 11> fields() const {
    return {n, c, h, w, m, kh, kw, stride_h, stride_w, pad_h, pad_w};
  }
};

// All three take float32 NCHW device memory on `device`, are queued on `stream`, and compute
// out = conv-pass(...) + beta · out (beta 0: overwrite, 1: accumulate). n == 0 does nothing.
// `bf16_operands`: both operands hold bf16 values (rounded under a bf16 compute dtype,
// ops/precision.hpp); TF32 holds them exactly, so the pass runs on the tensor cores whatever
// allow_tf32() says and equals a bf16 convolution accumulated in fp32. `direct`, where given, is
// offered to the legacy API's choice (ConvKernel).
// y = x ⋆ weight
void conv2d_forward_f32(cudaStream_t stream, int device, const Conv2dProblem& p, const float* x,
                        const float* weight, float beta, float* y, bool bf16_operands = false,
                        const ConvKernel& direct = {});
// dx = the adjoint of the forward applied to dy (a transposed convolution)
void conv2d_backward_data_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                              const float* dy, const float* weight, float beta, float* dx,
                              bool bf16_operands = false);
// dweight = Σ_n dy_n ⋆ x_n
void conv2d_backward_filter_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                                const float* x, const float* dy, float beta, float* dweight,
                                bool bf16_operands = false, const ConvKernel& direct = {});

}  // namespace pipeline::cuda

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
