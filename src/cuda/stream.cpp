#include <pipeline/cuda/stream.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/cuda/device_memory.hpp>

#include <map>

namespace pipeline::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

std::string device_description(int device) {
  cudaDeviceProp prop{};
  PIPELINE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return fmt::format("cuda: {} (cuda:{}, sm_{}{}, {:.1f} GiB)", prop.name, device, prop.major,
                     prop.minor, static_cast<double>(prop.totalGlobalMem) / (1 << 30));
}

DeviceGuard::DeviceGuard(int device) {
  PIPELINE_CUDA_CHECK(cudaGetDevice(&m_previous));
  if (m_previous != device) PIPELINE_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != m_previous) (void)cudaSetDevice(m_previous);
}

Stream Stream::create(int device) {
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  PIPELINE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s, device, true);
}

void Stream::synchronize() const { PIPELINE_CUDA_CHECK(cudaStreamSynchronize(m_stream)); }

void Stream::reset() noexcept {
  if (m_owned && m_stream != nullptr) {
    // Blocks of the device pool that name this stream must not outlive its handle (a tensor freed
    // after its rank's stream is gone, as in-process ranks end one after another).
    try {
      DeviceGuard guard(m_device);
      (void)cudaStreamSynchronize(m_stream);
      device_pool(m_device).forget_stream(m_stream);
    } catch (...) {  // at exit, with the runtime gone: nothing left to order
    }
    (void)cudaStreamDestroy(m_stream);
  }
  m_stream = nullptr;
  m_owned = false;
}

Event Event::create(int device, bool timing) {
  DeviceGuard guard(device);
  Event e;
  PIPELINE_CUDA_CHECK(
      cudaEventCreateWithFlags(&e.m_event, timing ? cudaEventDefault : cudaEventDisableTiming));
  e.m_device = device;
  return e;
}

void Event::record(cudaStream_t stream) {
  PIPELINE_CHECK(m_event != nullptr, "record on an empty Event (use Event::create)");
  PIPELINE_CUDA_CHECK(cudaEventRecord(m_event, stream));
}

bool Event::done() const {
  if (m_event == nullptr) return true;
  const cudaError_t e = cudaEventQuery(m_event);
  if (e == cudaErrorNotReady) return false;
  PIPELINE_CUDA_CHECK(e);
  return true;
}

void Event::synchronize() const {
  if (m_event != nullptr) PIPELINE_CUDA_CHECK(cudaEventSynchronize(m_event));
}

void Event::block(cudaStream_t stream) const {
  if (m_event != nullptr) PIPELINE_CUDA_CHECK(cudaStreamWaitEvent(stream, m_event, 0));
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  PIPELINE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.m_event, end.m_event));
  return ms;
}

void Event::reset() noexcept {
  if (m_event != nullptr) (void)cudaEventDestroy(m_event);
  m_event = nullptr;
}

namespace {
// Per thread: device -> its current stream (absent: the legacy default stream).
std::map<int, cudaStream_t>& current_streams() {
  thread_local std::map<int, cudaStream_t> streams;
  return streams;
}
}  // namespace

cudaStream_t current_stream(int device) {
  auto& m = current_streams();
  auto it = m.find(device);
  return it == m.end() ? nullptr : it->second;
}

StreamGuard::StreamGuard(const Stream& stream)
    : m_device(stream.device()), m_previous(current_stream(stream.device())) {
  current_streams()[m_device] = stream.get();
}

StreamGuard::~StreamGuard() { current_streams()[m_device] = m_previous; }

}  // namespace pipeline::cuda
