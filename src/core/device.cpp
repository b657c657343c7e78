#include <pipeline/core/device.hpp>

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/stream.hpp>
#endif

namespace pipeline {

int cuda_device_count() {
#if PIPELINE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace pipeline
