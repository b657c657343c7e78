// The number of CPU threads the ops use (Eigen's gemm threads and the OpenMP loops). The trainer
// sets it from --threads; by default it is the machine's cores divided among the ranks on it.
#pragma once

#include <cstddef>
#include <span>

namespace pipeline {

void set_num_threads(int n);
int num_threads();
// The CPUs this process may run on (its affinity mask: mpirun binds each rank to one core by
// default), or the machine's hardware threads when the mask cannot be read.
int allowed_cpus();
// allowed_cpus() divided by the number of ranks of the job on this host (the processes,
// OMPI_COMM_WORLD_LOCAL_SIZE when launched by mpirun, times the ranks of each process), at
// least 1. More threads than a rank's CPUs stall every parallel region on the descheduled thread.
int default_num_threads();
// The ranks of the job that run as threads of this process (an in-process pipeline: every stage
// a thread); 1 otherwise. Each rank's thread then sets its own num_threads (OpenMP's count is
// per thread).
void set_ranks_per_process(int n);
int ranks_per_process();

// memset(dst, 0, bytes) and memmove(dst, src, bytes) on num_threads() threads for large buffers
// (gradients zeroed and weight versions copied every step: serial, they were the part of a step
// that more threads did not shorten), plain memset / memmove below 256 KiB a thread or when the
// ranges overlap.
void zero_bytes(void* dst, std::size_t bytes);
void copy_bytes(void* dst, const void* src, std::size_t bytes);

// zero_bytes over several buffers in one parallel region: a model's many gradients, most too
// small to take the threads alone, share them.
struct ByteRange {
  void* data;
  std::size_t bytes;
};
void zero_bytes(std::span<const ByteRange> buffers);

}  // namespace pipeline
