// main() for the MPI suites (tests/mpi). Debian's doctest does not ship doctest's MPI extension,
// so this does its job: every rank runs every test case (each case uses MPI_COMM_WORLD as it
// needs), only rank 0 prints its summary unless a rank fails, and the exit status is the
// reduction of all ranks' results so that mpirun and CTest see any rank's failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  ctx.setOption("force-colors", false);
  int result = ctx.run();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (result != 0) std::fprintf(stderr, "rank %d: tests failed\n", rank);
  MPI_Finalize();
  return worst;
}
