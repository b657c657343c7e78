#include <pipeline/runtime/in_process.hpp>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/core/threads.hpp>

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/stream.hpp>
#endif

#include <optional>

namespace pipeline {

Device in_process_device(Device base, int rank, int visible_devices) {
  if (base.is_cpu()) return base;
  PIPELINE_CHECK_AS(ConfigError, visible_devices > 0,
                    "--device {}: this process sees no CUDA device (no GPU, no driver, "
                    "CUDA_VISIBLE_DEVICES hides them, or the build has no CUDA); use --device cpu",
                    base.str());
  PIPELINE_CHECK_AS(ConfigError, base.index < visible_devices,
                    "--device {}: this process sees {} CUDA device(s), cuda:0 to cuda:{}",
                    base.str(), visible_devices, visible_devices - 1);
  return Device::cuda((base.index + rank) % visible_devices);
}

void run_in_process(const InProcessOptions& options,
                    const std::function<void(Communicator&, Device)>& fn) {
  PIPELINE_CHECK_AS(ConfigError, options.ranks >= 1, "an in-process job needs at least one rank");
  const int visible = options.device.is_cpu() ? 0 : cuda_device_count();
  // Checked before any thread starts, so that a bad device is one error, not one per rank.
  for (int r = 0; r < options.ranks; ++r) in_process_device(options.device, r, visible);
  set_ranks_per_process(options.ranks);
  struct ResetRanks {
    ~ResetRanks() { set_ranks_per_process(1); }
  } reset_ranks;
  LocalHub hub(options.ranks);
  run_local(hub, [&](Communicator& comm) {
    detail::ThreadRankScope rank(comm.rank());
    if (options.comm_timeout_s > 0) comm.set_timeout(options.comm_timeout_s);
    const Device device = in_process_device(options.device, comm.rank(), visible);
#if PIPELINE_WITH_CUDA
    // The rank's own stream, current on its thread for the whole run.
    std::optional<cuda::DeviceGuard> device_guard;
    std::optional<cuda::Stream> stream;
    std::optional<cuda::StreamGuard> stream_guard;
    if (device.is_cuda()) {
      device_guard.emplace(device.index);
      stream.emplace(cuda::Stream::create(device.index));
      stream_guard.emplace(*stream);
    }
#endif
    fn(comm, device);
#if PIPELINE_WITH_CUDA
    if (stream) stream->synchronize();
#endif
  });
}

}  // namespace pipeline
