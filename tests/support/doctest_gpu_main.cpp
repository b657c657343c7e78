// The main of tests/gpu/: runs the doctest suite when this process sees a CUDA device, and exits
// with 77 (CTest's "skipped", SKIP_RETURN_CODE) when it sees none, so that a GPU test never
// passes without having run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <pipeline/cuda/stream.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (pipeline::cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device visible: skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
