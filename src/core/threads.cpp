#include <pipeline/core/threads.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

namespace {

// Runs fn(offset, length) over [0, bytes) in one contiguous piece per thread, each at least
// kMinPiece long (below it, waking the threads costs more than the memory traffic saves).
// Pieces start on 64-byte boundaries.
template <typename Fn>
void over_pieces(std::size_t bytes, Fn&& fn) {
  constexpr std::size_t kMinPiece = std::size_t{1} << 20;
  const std::size_t most = std::max<std::size_t>(1, bytes / kMinPiece);
  const int threads =
      static_cast<int>(std::min<std::size_t>(most, static_cast<std::size_t>(num_threads())));
  if (threads <= 1) {
    fn(std::size_t{0}, bytes);
    return;
  }
  const std::size_t piece = (bytes / static_cast<std::size_t>(threads) + 63) / 64 * 64;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(bytes, static_cast<std::size_t>(t) * piece);
    const std::size_t end = t + 1 == threads ? bytes : std::min(bytes, begin + piece);
    if (end > begin) fn(begin, end - begin);
  }
}

}  // namespace

void zero_bytes(void* dst, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  over_pieces(bytes, [d](std::size_t at, std::size_t n) { std::memset(d + at, 0, n); });
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const auto a = reinterpret_cast<std::uintptr_t>(d), b = reinterpret_cast<std::uintptr_t>(s);
  if (a < b + bytes && b < a + bytes) {  // overlapping: memmove's order matters
    std::memmove(d, s, bytes);
    return;
  }
  over_pieces(bytes, [d, s](std::size_t at, std::size_t n) { std::memcpy(d + at, s + at, n); });
}

}  // namespace pipeline
