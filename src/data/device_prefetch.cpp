#include <pipeline/data/device_prefetch.hpp>

#include <pipeline/core/error.hpp>

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/cuda/stream.hpp>

#include <array>
#include <cstring>
#endif

namespace pipeline {

#if PIPELINE_WITH_CUDA
namespace {

// Page-locked host memory, grown as needed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (m_ptr != nullptr) (void)cudaFreeHost(m_ptr);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  std::byte* reserve(std::size_t bytes) {
    if (bytes > m_bytes) {
      if (m_ptr != nullptr) PIPELINE_CUDA_CHECK(cudaFreeHost(m_ptr));
      m_ptr = nullptr;
      PIPELINE_CUDA_CHECK(cudaHostAlloc(&m_ptr, bytes, cudaHostAllocDefault));
      m_bytes = bytes;
    }
    return static_cast<std::byte*>(m_ptr);
  }

 private:
  void* m_ptr = nullptr;
  std::size_t m_bytes = 0;
};

}  // namespace

struct DevicePrefetcher::Impl {
  explicit Impl(int device) : stream(cuda::Stream::create(device)) {
    for (auto& e : copied) e = cuda::Event::create(device);
  }
  cuda::Stream stream;
  std::array<PinnedBuffer, 2> pinned;
  std::array<cuda::Event, 2> copied;  // recorded after each buffer's transfer
  std::array<bool, 2> in_flight{false, false};
  int next = 0;
  int last = -1;
};
#else
struct DevicePrefetcher::Impl {};
#endif

DevicePrefetcher::DevicePrefetcher(Device device) : m_device(device) {
#if PIPELINE_WITH_CUDA
  if (device.is_cuda()) m_impl = std::make_unique<Impl>(device.index);
#else
  PIPELINE_CHECK_AS(ConfigError, device.is_cpu(),
                    "cannot stage batches on {}: this build has no CUDA support", device.str());
#endif
}

DevicePrefetcher::~DevicePrefetcher() = default;

void DevicePrefetcher::stage(const Batch& host) {
  PIPELINE_CHECK(!m_has_staged, "DevicePrefetcher: stage() twice without take()");
  m_has_staged = true;
  if (m_device.is_cpu()) {
    m_staged = host;
    return;
  }
#if PIPELINE_WITH_CUDA
  Impl& s = *m_impl;
  const int k = s.next;
  s.next ^= 1;
  // The buffer's previous transfer (two batches ago) must be done before it is refilled.
  if (s.in_flight[k]) s.copied[k].synchronize();
  const std::size_t in_bytes = host.inputs.nbytes(), label_bytes = host.labels.nbytes();
  std::byte* buf = s.pinned[k].reserve(in_bytes + label_bytes);
  if (in_bytes > 0) std::memcpy(buf, host.inputs.raw(), in_bytes);
  if (label_bytes > 0) std::memcpy(buf + in_bytes, host.labels.raw(), label_bytes);
  // Allocated while the side stream is current: the blocks are ordered on it; take() records the
  // consumer's stream on them so they are not reused before the step is done with them.
  const cuda::StreamGuard on_side(s.stream);
  m_staged.inputs = Tensor::empty(host.inputs.shape(), host.inputs.dtype(), m_device);
  m_staged.labels = Tensor::empty(host.labels.shape(), host.labels.dtype(), m_device);
  const cuda::DeviceGuard guard(m_device.index);
  if (in_bytes > 0)
    PIPELINE_CUDA_CHECK(cudaMemcpyAsync(m_staged.inputs.raw(), buf, in_bytes,
                                        cudaMemcpyHostToDevice, s.stream.get()));
  if (label_bytes > 0)
    PIPELINE_CUDA_CHECK(cudaMemcpyAsync(m_staged.labels.raw(), buf + in_bytes, label_bytes,
                                        cudaMemcpyHostToDevice, s.stream.get()));
  s.copied[k].record(s.stream.get());
  s.in_flight[k] = true;
  s.last = k;
#endif
}

Batch DevicePrefetcher::take() {
  PIPELINE_CHECK(m_has_staged, "DevicePrefetcher: take() without stage()");
  m_has_staged = false;
  Batch out = std::move(m_staged);
  m_staged = Batch{};
#if PIPELINE_WITH_CUDA
  if (m_device.is_cuda()) {
    const cudaStream_t consumer = cuda::current_stream(m_device.index);
    m_impl->copied[static_cast<std::size_t>(m_impl->last)].block(consumer);
    if (out.inputs.defined() && out.inputs.nbytes() > 0) cuda::record_stream(out.inputs, consumer);
    if (out.labels.defined() && out.labels.nbytes() > 0) cuda::record_stream(out.labels, consumer);
  }
#endif
  return out;
}

}  // namespace pipeline
