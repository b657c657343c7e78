// Embedding lookup (a row gather) and its gradient (a row scatter-add), deterministic.
//
// The forward copies table rows to the output, one thread per output element.
//
// The backward must add dout rows of repeated ids into the same table row. Atomics would do it
// but in an order that changes from run to run, so the sums would differ in their last bits.
// Instead the (id, position) pairs are sorted by id with CUB's radix sort, which is stable, so
// within a run of equal ids the positions stay increasing; then the block that meets the start of
// a run walks it and adds the rows in that order onto the table row. That is the CPU op's order
// (it adds ids in increasing position), so the result is identical bit for bit, whatever the
// schedule. The walk is serial within a run, so a very frequent id costs a long walk; columns
// are spread over threads and column tiles, so a run of length L costs L dependent loads per
// thread, about what the CPU pays.
#include "common.cuh"
#include "embedding.cuh"

#include <pipeline/cuda/check.hpp>

#include <cub/device/device_radix_sort.cuh>

namespace pipeline::kernels {

namespace {

constexpr int kGatherThreads = 256;
constexpr int kColumnTile = 128;  // threads (columns) of a backward block
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

// Bits of the largest id, the only ones the sort has to look at.
int key_bits(std::int64_t vocab) {
  int bits = 1;
  while (bits < 31 && (std::int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

struct Layout {
  std::size_t keys_out, positions_in, positions_out, temp, temp_bytes, total;
};

Layout layout(std::int64_t n, std::int64_t vocab) {
  const std::size_t count = static_cast<std::size_t>(n);
  std::size_t temp_bytes = 0;
  PIPELINE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const unsigned*>(nullptr), static_cast<unsigned*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), n, 0,
      key_bits(vocab)));
  Layout l{};
  l.keys_out = 0;
  l.positions_in = l.keys_out + align_up(count * sizeof(unsigned));
  l.positions_out = l.positions_in + align_up(count * sizeof(std::int32_t));
  l.temp = l.positions_out + align_up(count * sizeof(std::int32_t));
  l.temp_bytes = temp_bytes;
  l.total = l.temp + align_up(temp_bytes);
  return l;
}

}  // namespace

// An id outside [0, vocab) gives a zero row (and the backward skips it): the op checks ids before
// launching, except inside a CUDA graph capture, where the check runs after the replay and must
// find memory intact to report.
static __global__ void embedding_forward_kernel(const std::int32_t* ids, std::int64_t n,
                                                const float* table, std::int64_t dim,
                                                std::int64_t vocab, float* out) {
  const std::int64_t total = n * dim;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const std::int64_t i = e / dim, c = e - i * dim;
    const std::int64_t id = ids[i];
    out[e] = id >= 0 && id < vocab ? table[id * dim + c] : 0.f;
  }
}

static __global__ void iota_kernel(std::int32_t* v, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    v[i] = static_cast<std::int32_t>(i);
}

// Blocks stride over the sorted positions j; one whose j starts a run of equal ids adds that
// run's dout rows, in sorted (= increasing position) order, to the table row of the columns of
// tile blockIdx.y.
static __global__ __launch_bounds__(kColumnTile) void embedding_backward_kernel(
    const unsigned* sorted_ids, const std::int32_t* positions, std::int64_t n, const float* dout,
    std::int64_t dim, std::int64_t vocab, float* dtable) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * kColumnTile + threadIdx.x;
  for (std::int64_t j = blockIdx.x; j < n; j += gridDim.x) {
    const unsigned id = sorted_ids[j];
    if (j > 0 && sorted_ids[j - 1] == id) continue;  // not the start of a run
    if (c >= dim || id >= vocab) continue;
    float* row = dtable + static_cast<std::int64_t>(id) * dim;
    float acc = row[c];
    for (std::int64_t k = j; k < n && sorted_ids[k] == id; ++k)
      acc += dout[static_cast<std::int64_t>(positions[k]) * dim + c];
    row[c] = acc;
  }
}

void embedding_forward(cudaStream_t stream, const std::int32_t* ids, std::int64_t n,
                       const float* table, std::int64_t dim, std::int64_t vocab, float* out) {
  if (n <= 0 || dim <= 0) return;
  embedding_forward_kernel<<<detail::grid_for(n * dim, kGatherThreads), kGatherThreads, 0,
                             stream>>>(ids, n, table, dim, vocab, out);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

std::size_t embedding_backward_workspace_bytes(std::int64_t n, std::int64_t vocab) {
  if (n <= 0) return 0;
  return layout(n, vocab).total;
}

void embedding_backward(cudaStream_t stream, const std::int32_t* ids, std::int64_t n,
                        const float* dout, std::int64_t dim, std::int64_t vocab, float* dtable,
                        void* workspace) {
  if (n <= 0 || dim <= 0) return;
  const Layout l = layout(n, vocab);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* keys_out = reinterpret_cast<unsigned*>(base + l.keys_out);
  auto* positions_in = reinterpret_cast<std::int32_t*>(base + l.positions_in);
  auto* positions_out = reinterpret_cast<std::int32_t*>(base + l.positions_out);
  std::size_t temp_bytes = l.temp_bytes;

  iota_kernel<<<detail::grid_for(n, kGatherThreads), kGatherThreads, 0, stream>>>(positions_in, n);
  PIPELINE_CUDA_LAUNCH_CHECK();
  // ids were checked to be non-negative, so as unsigned keys they sort the same.
  PIPELINE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      base + l.temp, temp_bytes, reinterpret_cast<const unsigned*>(ids), keys_out, positions_in,
      positions_out, n, 0, key_bits(vocab), stream));
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(n, detail::kMaxGridBlocks)),
                  static_cast<unsigned>((dim + kColumnTile - 1) / kColumnTile));
  embedding_backward_kernel<<<grid, kColumnTile, 0, stream>>>(keys_out, positions_out, n, dout, dim,
                                                              vocab, dtable);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
