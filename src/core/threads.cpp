#include <pipeline/core/threads.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <sched.h>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pipeline {

namespace {
int g_threads = 0;
int g_ranks_per_process = 1;
}

void set_num_threads(int n) {
  g_threads = std::max(1, n);
  Eigen::setNbThreads(g_threads);
#ifdef _OPENMP
  omp_set_num_threads(g_threads);
#endif
}

int num_threads() { return g_threads > 0 ? g_threads : default_num_threads(); }

int allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int default_num_threads() {
  // A rank bound to one core sees one CPU here (1 / local rounds up to 1); unbound ranks share
  // the mask with the job's other ranks on this host.
  const int cpus = allowed_cpus();
  int local = 1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var)) {
      local = std::max(1, std::atoi(v));
      break;
    }
  }
  return std::max(1, cpus / (local * g_ranks_per_process));
}

void set_ranks_per_process(int n) {
  g_ranks_per_process = std::max(1, n);
}

}  // namespace pipeline
