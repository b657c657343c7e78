// PIPELINE_MPI_CHECK: every MPI return code goes through it.
//
// MPI communicators created by the library use MPI_ERRORS_RETURN, so failures come back as codes
// instead of aborting inside MPI; this macro turns a code other than MPI_SUCCESS into a
// pipeline::MpiError whose message carries MPI's own error text, the failing expression,
// file:line, the world rank, the host and the process id — what one needs to find the failing
// process in the interleaved output of mpirun.
#pragma once

#include <pipeline/core/error.hpp>

#include <fmt/format.h>
#include <mpi.h>

#include <unistd.h>

#include <string>

namespace pipeline::detail {

// MPI's text for an error code, e.g. "MPI_ERR_TRUNCATE: message truncated".
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    return fmt::format("MPI error code {}", code);
  return std::string(text, static_cast<std::size_t>(len));
}

// The rank in MPI_COMM_WORLD, or -1 outside MPI_Init..MPI_Finalize.
inline int mpi_world_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] inline void mpi_fail(int code, const char* expr, const char* file, int line) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  fail<MpiError>(
      expr, file, line,
      fmt::format("MPI call failed with {} (world rank {}, host {}, pid {})",
                  mpi_error_string(code), mpi_world_rank(), host, static_cast<long>(::getpid())));
}

}  // namespace pipeline::detail

#define PIPELINE_MPI_CHECK(expr)                                                 \
  do {                                                                           \
    const int pipeline_mpi_rc_ = (expr);                                         \
    if (pipeline_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                            \
      ::pipeline::detail::mpi_fail(pipeline_mpi_rc_, #expr, __FILE__, __LINE__); \
  } while (0)
