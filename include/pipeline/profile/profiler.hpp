// The profiler: measures every layer of a Sequential model and returns a Profile (profile.hpp),
// the input of the partitioner and the simulator.
//
// Each layer is measured the way the runtime runs it: on the same number of threads
// (pipeline::num_threads(), which the profiler also hands to Eigen and OpenMP so that they agree),
// on a whole minibatch of `batch` samples, in training mode, with parameters from the layer's own
// initialiser, and on real inputs — the model's input is random data of the input dtype (token ids
// in [0, input_int_bound) for int32 inputs, standard normal values for float inputs) and every
// later layer gets the previous layer's actual output. Each repetition is a whole training pass
// (every layer's forward in order, then every backward in reverse) with each layer timed inside
// it, so that a layer meets the caches a training step leaves it. Per layer it records:
//   forward_s           median over `repeat` passes (after `warmup` untimed ones)
//   backward_s          median of the full backward (input and weight gradients together)
//   backward_input_s    median of the input-gradient-only backward (GradParts::Input);
//                       for a layer without weights the whole backward (= backward_s)
//   backward_weight_s   median of the weight-gradient-only backward (GradParts::Weight);
//                       0 for a layer without weights
//   *_spread_s          interquartile range of the forward and full-backward repeats
//   output_bytes        bytes of the layer's output for the whole minibatch
//   parameter_bytes     bytes of trainable parameters (Layer::parameter_bytes)
//   flops               Layer::flops for the minibatch's input shape
//   step_s              median of one optimizer step over the layer's parameters for each
//                       update rule (SGD, SGD with momentum, AdamW), timed inside each pass
//                       after its backward, every layer in order, as the executor steps
//
// On a CUDA device (CUDA builds) the parameters, input and gradients live on the device and each
// layer's time is the device time between CUDA events recorded around it on the current stream,
// read at the end of each pass (one synchronisation per pass, as in training); the profile's
// `device` names the GPU.
//
// Contract: `input_shape` is one sample's shape, without the batch dimension; batch, warmup >= 0
// and repeat >= 1 are checked (ConfigError), and so is the device (a CUDA device this process
// does not see, or any CUDA device in a build without CUDA). The model's output gradient is
// random, as the loss's gradient would be; nothing is printed.
#pragma once

#include <pipeline/core/device.hpp>
#include <pipeline/core/dtype.hpp>
#include <pipeline/core/shape.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/profile/profile.hpp>

#include <cstdint>
#include <string>

namespace pipeline {

struct ProfileOptions {
  int warmup = 2;   // untimed runs before the timed ones (caches, allocator, thread pool)
  int repeat = 10;  // timed runs; medians and interquartile ranges are taken over these
  // Seed of the parameters, the random input, the output gradient and dropout masks.
  std::uint64_t seed = 0;
  // The model's input: float32 values, or int32 token ids below input_int_bound (the vocabulary).
  DType input_dtype = DType::Float32;
  std::int64_t input_int_bound = 2;
  // Measure GradParts::Input and GradParts::Weight separately for layers with weights; off, the
  // split fields stay 0 ("unknown") and profiling takes about half as long.
  bool split_backward = true;
  // The dtype the products compute in (ops/precision.hpp): float32, or bfloat16 for a bf16
  // profile ("dtype": "bfloat16", with each layer's stashed_parameter_bytes).
  DType compute_dtype = DType::Float32;
  // > 0: profile the layers this many at a time, each group in passes of its own on random
  // activations of its input shape, freed before the next group: a model whose passes do not fit
  // the device at once (its parameters, gradients and optimizer states) is profiled in pieces.
  // 0: all layers in the same passes.
  int layers_per_pass = 0;
};

Profile profile(const Sequential& model, const Shape& input_shape, int batch, Device device,
                const ProfileOptions& options = {});

// A zoo model, with its own sample shape and input dtype (token ids below its vocabulary).
Profile profile(const ZooModel& model, int batch, Device device, ProfileOptions options = {});

// "cpu: <model name from /proc/cpuinfo> (<n> threads)": the profile's `device` string.
std::string cpu_device_description(int threads);

}  // namespace pipeline
