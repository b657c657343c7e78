#include <pipeline/comm/transport.hpp>

#include <cstdlib>

namespace pipeline {

namespace {

std::string plural(int n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  PIPELINE_CHECK_AS(ConfigError, end != v && *end == '\0' && n >= 0 && n < 1'000'000,
                    "{}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(n);
}

}  // namespace

std::string_view transport_name(Transport t) {
  switch (t) {
    case Transport::Nccl:
      return "nccl";
    case Transport::Mpi:
      return "mpi";
    case Transport::Local:
      return "local";
  }
  return "?";
}

TransportRequest parse_transport_request(std::string_view text) {
  if (text == "auto") return TransportRequest::Auto;
  if (text == "nccl") return TransportRequest::Nccl;
  if (text == "mpi") return TransportRequest::Mpi;
  if (text == "local") return TransportRequest::Local;
  PIPELINE_FAIL(ConfigError, "unknown transport '--comm {}': use nccl, mpi, local or auto", text);
}

TransportChoice choose_transport(TransportRequest requested, const TransportEnvironment& env) {
  PIPELINE_CHECK_AS(ConfigError, env.local_size >= 1 && env.local_rank >= 0 &&
                                     env.local_rank < env.local_size,
                    "node-local rank {} of {} ranks on this host is not a valid position",
                    env.local_rank, env.local_size);
  PIPELINE_CHECK_AS(ConfigError, env.visible_devices >= 0, "{} visible CUDA devices",
                    env.visible_devices);
  const int devices = env.visible_devices;
  const std::string ranks = plural(env.local_size, "rank", "ranks");
  const std::string gpus = plural(devices, "GPU", "GPUs");
  const bool own_gpu = devices > 0 && env.local_size <= devices;

  if (requested == TransportRequest::Local)
    return {Transport::Local, -1,
            "in-process (--comm local): every stage a thread of this process"};

  if (env.cpu_run) {
    PIPELINE_CHECK_AS(ConfigError, requested != TransportRequest::Nccl,
                      "--comm nccl moves tensors between GPUs but the run trains on the CPU: add "
                      "--device cuda, or use --comm mpi");
    return {Transport::Mpi, -1, "MPI: the run trains on the CPU"};
  }

  if (requested == TransportRequest::Nccl) {
    PIPELINE_CHECK_AS(ConfigError, env.build_has_nccl,
                      "--comm nccl: this build has no NCCL (it was configured without CUDA, "
                      "PIPELINE_WITH_CUDA=OFF); use --comm mpi, or rebuild with CUDA");
    PIPELINE_CHECK_AS(ConfigError, devices > 0,
                      "--comm nccl: rank {} of this host sees no CUDA device (check "
                      "CUDA_VISIBLE_DEVICES and the driver); use --comm mpi",
                      env.local_rank);
    PIPELINE_CHECK_AS(ConfigError, own_gpu,
                      "--comm nccl: {} on this host share {}; NCCL needs a GPU of its own for "
                      "every rank: run at most {} per host, or use --comm mpi (device staging)",
                      ranks, gpus, plural(devices, "rank", "ranks"));
    return {Transport::Nccl, env.local_rank,
            fmt::format("NCCL (--comm nccl): {} on this host, {}: one each", ranks, gpus)};
  }

  if (requested == TransportRequest::Mpi) {
    if (devices == 0)
      return {Transport::Mpi, -1, "MPI (--comm mpi): no GPU visible, tensors stay on the CPU"};
    return {Transport::Mpi, env.local_rank % devices,
            fmt::format("MPI with device staging (--comm mpi): {} on this host, {}", ranks,
                        gpus)};
  }

  // Auto.
  if (devices == 0) return {Transport::Mpi, -1, "MPI: no GPU visible, tensors stay on the CPU"};
  if (!env.build_has_nccl)
    return {Transport::Mpi, env.local_rank % devices,
            fmt::format("MPI with device staging: this build has no NCCL ({} on this host, {})",
                        ranks, gpus)};
  if (own_gpu)
    return {Transport::Nccl, env.local_rank,
            fmt::format("NCCL: {} on this host, {}: one each", ranks, gpus)};
  return {Transport::Mpi, env.local_rank % devices,
          fmt::format("MPI with device staging: {} share {}", ranks, gpus)};
}

LocalRank local_rank_from_env() {
  LocalRank r;
  r.size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  r.rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  PIPELINE_CHECK_AS(ConfigError, r.size >= 1 && r.rank < r.size,
                    "OMPI_COMM_WORLD_LOCAL_RANK={} is not below OMPI_COMM_WORLD_LOCAL_SIZE={}",
                    r.rank, r.size);
  return r;
}

}  // namespace pipeline
