// In-process pipelines: the ranks of a job as threads of one process.
//
// How a pipeline runs on a single GPU (or on one machine's CPU without MPI), and how the GPU
// runtime is tested there. Every rank of the plan is a thread with its own endpoint of one
// LocalHub (comms/local.hpp), its own rank in errors and log lines (ThreadRankScope), its share
// of the CPU threads (set_ranks_per_process) and, on GPUs, its own device and its own stream
// (the thread's current stream), so that the stages' kernels run concurrently and tensors pass
// between them by device-to-device copies ordered by events.
//
//   run_in_process({.ranks = 4, .device = Device::cuda(0)}, [&](Communicator& comm, Device d) {
//     StageExecutor ex(model, shape, dtype, layout, comm, make_optimizer(), {.device = d});
//     ...
//   });
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/core/device.hpp>

#include <functional>

namespace pipeline {

struct InProcessOptions {
  int ranks = 1;
  // The CPU, or cuda:N: rank r computes on cuda:((N + r) mod the visible GPUs).
  Device device = Device::cpu();
  double comm_timeout_s = 0;  // 0: PIPELINE_COMM_TIMEOUT or the default
};

// The device of `rank` in an in-process job on `base` with `visible_devices` GPUs. ConfigError
// when a GPU is asked for and none is visible, or the build has no CUDA.
Device in_process_device(Device base, int rank, int visible_devices);

// Runs fn(comm, device) on options.ranks threads and returns when all have ended. When one
// throws, the others' waits end (CommAbortedError) and the first failure is rethrown here.
void run_in_process(const InProcessOptions& options,
                    const std::function<void(Communicator&, Device)>& fn);

}  // namespace pipeline
