#include <pipeline/core/threads.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdlib>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pipeline {

namespace {
int g_threads = 0;
}

void set_num_threads(int n) {
  g_threads = std::max(1, n);
  Eigen::setNbThreads(g_threads);
#ifdef _OPENMP
  omp_set_num_threads(g_threads);
#endif
}

int num_threads() { return g_threads > 0 ? g_threads : default_num_threads(); }

int default_num_threads() {
  int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int local = 1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var)) {
      local = std::max(1, std::atoi(v));
      break;
    }
  }
  return std::max(1, hw / local);
}

}  // namespace pipeline
