// Comparing a CUDA op against its CPU reference (tests/gpu/): random non-zero inputs, poisoned
// device outputs, and a normalised comparison that prints the first mismatches.
//
// The error of element i is |gpu_i − cpu_i| / max(|cpu_i|, rms(cpu)): relative where values are
// of typical size, and measured against the tensor's typical magnitude where the reference is
// near zero (where a relative error says nothing: GELU of −3 is 1 + erf(−2.1) ≈ 0.003, a
// difference of nearly equal numbers). A NaN on the device side always fails, so outputs are
// filled with NaN before the op runs and an element the kernel forgot to write is caught.
#pragma once

#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/cuda/dnn_graph.hpp>
#include <pipeline/data/dataset.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline::gpu_test {

inline const Device kGpu = Device::cuda(0);

// Uniform in [lo, hi), with exact zeros moved to hi / 2 (inputs are non-zero, so a kernel that
// skips an element or multiplies by a stray zero cannot pass by accident).
inline Tensor random_tensor(const Shape& shape, std::uint64_t seed, float lo = -1.f,
                            float hi = 1.f) {
  Tensor t = Tensor::empty(shape);
  Rng rng(seed, "gpu-test");
  for (float& v : t.values()) {
    v = rng.uniform(lo, hi);
    if (v == 0.f) v = hi / 2;
  }
  return t;
}

// Integers uniform in [0, n).
inline Tensor random_ints(const Shape& shape, std::uint64_t seed, std::int32_t n) {
  Tensor t = Tensor::empty(shape, DType::Int32);
  Rng rng(seed, "gpu-test-ints");
  std::int32_t* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(n)));
  return t;
}

// A float32 tensor of `shape` on the GPU, every element NaN.
inline Tensor poisoned(const Shape& shape) {
  return Tensor::full(shape, std::numeric_limits<float>::quiet_NaN(), kGpu);
}

// Restores the process-wide choice of cuDNN API for convolutions (cuda/dnn_graph.hpp) when a test
// that changes it ends, however it ends.
struct RestoreGraphConvolutions {
  cuda::GraphConvolutions was = cuda::graph_convolutions();
  ~RestoreGraphConvolutions() { cuda::set_graph_convolutions(was); }
};

// Token windows of a fixed random byte stream, [batch, seq_len] ids and labels (the inputs shifted
// by one, as the text dataset makes them).
inline Batch token_batch(std::int64_t batch, std::int64_t seq_len, std::int32_t vocab,
                         std::uint64_t seed) {
  const Tensor stream = random_ints(Shape{batch, seq_len + 1}, seed, vocab);
  Batch b{Tensor::empty({batch, seq_len}, DType::Int32),
          Tensor::empty({batch, seq_len}, DType::Int32)};
  const std::int32_t* s = stream.data<std::int32_t>();
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t t = 0; t < seq_len; ++t) {
      b.inputs.data<std::int32_t>()[i * seq_len + t] = s[i * (seq_len + 1) + t];
      b.labels.data<std::int32_t>()[i * seq_len + t] = s[i * (seq_len + 1) + t + 1];
    }
  return b;
}

inline Tensor host(const Tensor& t) {
  return t.to(Device::cpu());
}

namespace detail {

inline void report(std::string msg, const std::vector<std::string>& first) {
  msg += "; first mismatches (index: cpu vs gpu):";
  for (const std::string& s : first) msg += "\n  " + s;
  FAIL_CHECK(msg);
}

}  // namespace detail

// Every element of `gpu` (any device; copied to the host) within `tol` normalised error of
// `cpu`. Shapes need not match, element counts must. Errors are normalised by the larger of the
// element and the output's RMS, and at least by `scale`: the size of the terms a result cancels
// from, where the exact result is ~0 and the RMS is only rounding.
inline bool expect_close(std::string_view what, const Tensor& cpu, const Tensor& gpu, double tol,
                         double scale = 0) {
  const Tensor g = host(gpu);
  REQUIRE_MESSAGE(g.numel() == cpu.numel(), what, ": element counts differ");
  const std::int64_t n = cpu.numel();
  if (n == 0) return true;
  const float* a = cpu.data<float>();
  const float* b = g.data<float>();
  double ss = 0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(a[i]) * a[i];
  const double floor = std::max({std::sqrt(ss / static_cast<double>(n)), scale, 1e-30});
  std::int64_t bad = 0, worst_at = -1;
  double worst = 0;
  std::vector<std::string> first;
  for (std::int64_t i = 0; i < n; ++i) {
    const double err = std::abs(static_cast<double>(b[i]) - a[i]) /
                       std::max(std::abs(static_cast<double>(a[i])), floor);
    if (!(err <= tol)) {  // NaN fails
      ++bad;
      if (first.size() < 8) first.push_back(fmt::format("{}: {:.9g} vs {:.9g}", i, a[i], b[i]));
    }
    if (!(err <= worst)) {
      worst = err;
      worst_at = i;
    }
  }
  if (bad > 0)
    detail::report(fmt::format("{}: {} of {} elements differ beyond {:g} (worst normalised "
                               "error {:g} at {})",
                               what, bad, n, tol, worst, worst_at),
                   first);
  return bad == 0;
}

// Bitwise-equal float32 or int32 elements (dropout masks, exactly reproduced sums).
inline bool expect_equal(std::string_view what, const Tensor& cpu, const Tensor& gpu) {
  const Tensor g = host(gpu);
  REQUIRE_MESSAGE(g.numel() == cpu.numel(), what, ": element counts differ");
  REQUIRE_MESSAGE(g.dtype() == cpu.dtype(), what, ": dtypes differ");
  const std::int64_t n = cpu.numel();
  std::int64_t bad = 0;
  std::vector<std::string> first;
  const auto* a = static_cast<const unsigned char*>(cpu.raw());
  const auto* b = static_cast<const unsigned char*>(g.raw());
  const std::size_t size = dtype_size(cpu.dtype());
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i * size, b + i * size, size) == 0) continue;
    ++bad;
    if (first.size() < 8) {
      if (cpu.dtype() == DType::Int32)
        first.push_back(
            fmt::format("{}: {} vs {}", i, cpu.data<std::int32_t>()[i], g.data<std::int32_t>()[i]));
      else
        first.push_back(
            fmt::format("{}: {:.9g} vs {:.9g}", i, cpu.data<float>()[i], g.data<float>()[i]));
    }
  }
  if (bad > 0)
    detail::report(fmt::format("{}: {} of {} elements are not bitwise equal", what, bad, n), first);
  return bad == 0;
}

}  // namespace pipeline::gpu_test
