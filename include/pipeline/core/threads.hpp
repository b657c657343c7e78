// The number of CPU threads the ops use (Eigen's gemm threads and the OpenMP loops). The trainer
// sets it from --threads; by default it is the machine's cores divided among the ranks on it.
#pragma once

namespace pipeline {

void set_num_threads(int n);
int num_threads();
// Hardware threads of this machine divided by the number of processes of the job on this host
// (OMPI_COMM_WORLD_LOCAL_SIZE when launched by mpirun), at least 1.
int default_num_threads();

}  // namespace pipeline
