// Choosing how the ranks of a job talk: NCCL when every rank of a host has a GPU of its own,
// MPI (with device staging when tensors live on GPUs) otherwise, the in-process communicator on
// request. `--comm nccl|mpi|local|auto` overrides the choice; a request that cannot work is a
// ConfigError that says why. Plain data in, a decision and a one-line reason out (printed at
// start-up), so the decision table is tested without a GPU. Includes no CUDA header.
#pragma once

#include <pipeline/core/error.hpp>

#include <string>
#include <string_view>

namespace pipeline {

enum class Transport { Nccl, Mpi, Local };
// What `--comm` asked for.
enum class TransportRequest { Auto, Nccl, Mpi, Local };

// "nccl", "mpi", "local"
std::string_view transport_name(Transport t);
// "nccl", "mpi", "local" or "auto"; ConfigError naming the accepted spellings otherwise.
TransportRequest parse_transport_request(std::string_view text);

// What the decision depends on.
struct TransportEnvironment {
  bool build_has_nccl = false;  // a PIPELINE_WITH_CUDA build (NCCL is linked with CUDA)
  int local_rank = 0;           // this rank's index among the ranks of its host
  int local_size = 1;           // ranks on this host
  int visible_devices = 0;      // CUDA devices this process sees
  bool cpu_run = false;         // the run trains on the CPU (--device cpu): MPI moves its tensors
};

struct TransportChoice {
  Transport transport = Transport::Mpi;
  // The GPU this rank uses: its own (local rank) for NCCL, shared round-robin for staged MPI;
  // -1 without a GPU or for the in-process transport (whose stages pick their own).
  int device = -1;
  // "NCCL: 4 ranks on this host, 8 GPUs: one each"
  std::string reason;
};

TransportChoice choose_transport(TransportRequest requested, const TransportEnvironment& env);

// Node-local rank and size from Open MPI's OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE (0 and 1
// when not started by mpirun); ConfigError when they are set but not numbers.
struct LocalRank {
  int rank = 0;
  int size = 1;
};
LocalRank local_rank_from_env();

}  // namespace pipeline
