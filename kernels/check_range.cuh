// Launcher of the index range check (check_range.cu): finds the first element of an int32 array
// outside [lo, hi). Class labels and token ids are checked with it before anything is written,
// as the CPU ops check them, so a bad dataset gives the same error on either device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

struct RangeViolation {
  std::int64_t index = -1;  // first position outside [lo, hi), or -1 when every value is inside
  std::int32_t value = 0;   // the value found there
};

// Writes the RangeViolation of v[0, n) into *out (device memory). Asynchronous on `stream`;
// n <= 0 writes index -1.
void find_out_of_range(cudaStream_t stream, const std::int32_t* v, std::int64_t n, std::int32_t lo,
                       std::int32_t hi, RangeViolation* out);

// The same, waited for: copies the result to the host (blocks until the stream reaches it).
// `scratch` is device memory for one RangeViolation.
RangeViolation find_out_of_range_sync(cudaStream_t stream, const std::int32_t* v, std::int64_t n,
                                      std::int32_t lo, std::int32_t hi, RangeViolation* scratch);

}  // namespace pipeline::kernels
