#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/core/threads.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace test_tensor {

using namespace pipeline;

TEST_CASE("tensor views share storage without copying") {
  Tensor t = Tensor::from_vector({4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor s = t.slice(1, 3);
  CHECK(s.shape() == Shape{2, 3});
  CHECK(s.data<float>()[0] == 3.f);
  s.data<float>()[0] = 42.f;
  CHECK(t.data<float>()[3] == 42.f);
  CHECK(s.same_storage(t));
  Tensor r = t.reshape({2, 6});
  CHECK(r.data<float>()[3] == 42.f);
  Tensor c = t.clone();
  c.data<float>()[3] = 0.f;
  CHECK(t.data<float>()[3] == 42.f);
  CHECK_FALSE(c.same_storage(t));
}

TEST_CASE("tensor rejects bad shapes and accesses with a clear error") {
  Tensor t = Tensor::zeros({2, 3});
  CHECK_THROWS_AS(t.slice(1, 5), Error);
  CHECK_THROWS_AS(t.reshape({4, 2}), Error);
  CHECK_THROWS_AS(t.data<std::int32_t>(), Error);
  CHECK_THROWS_AS(Shape({2, -1}), ConfigError);
#if PIPELINE_WITH_CUDA
  CHECK_THROWS_WITH_AS(Tensor::empty({2}, DType::Float32, Device::cuda(1000)),
                       doctest::Contains("cuda:1000 does not exist"), ConfigError);
#else
  CHECK_THROWS_WITH_AS(Tensor::empty({2}, DType::Float32, Device::cuda(0)),
                       doctest::Contains("no CUDA support"), ConfigError);
#endif
  // Sizes from files (safetensors headers, found by fuzz/safetensors.cpp): an element count
  // beyond int64, or a byte count beyond size_t, is an error, not a wrapped small allocation.
  CHECK_THROWS_WITH_AS(Shape({1LL << 40, 1LL << 40}), doctest::Contains("more elements"),
                       ConfigError);
  CHECK(Shape({1LL << 40, 0, 1LL << 40}).numel() == 0);
  CHECK_THROWS_WITH_AS(Tensor::empty({1LL << 40, 1LL << 22}), doctest::Contains("more bytes"),
                       ConfigError);
}

TEST_CASE("int32 tensors hold labels") {
  Tensor t = Tensor::from_ints({3}, {1, 2, 9});
  CHECK(t.dtype() == DType::Int32);
  CHECK(t.data<std::int32_t>()[2] == 9);
  CHECK(t.nbytes() == 12);
}

TEST_CASE("rng streams depend only on seed and key") {
  Rng a(7, "conv1.weight"), b(7, "conv1.weight"), c(7, "conv2.weight"), d(8, "conv1.weight");
  bool differs_c = false, differs_d = false;
  for (int i = 0; i < 16; ++i) {
    float x = a.normal(), y = b.normal(), z = c.normal(), w = d.normal();
    CHECK(x == y);
    differs_c |= (x != z);
    differs_d |= (x != w);
  }
  CHECK(differs_c);
  CHECK(differs_d);
}

TEST_CASE("rng moments are right") {
  Rng r(1);
  double s = 0, s2 = 0, u = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = r.normal();
    s += x;
    s2 += x * x;
    u += r.uniform();
  }
  CHECK(std::abs(s / n) < 0.01);
  CHECK(std::abs(s2 / n - 1.0) < 0.02);
  CHECK(std::abs(u / n - 0.5) < 0.01);
}

TEST_CASE("Tensor zero and copy of large buffers on several threads") {
  const int before = num_threads();
  for (int threads : {1, 3}) {
    for (std::int64_t n : {std::int64_t{5}, std::int64_t{(5 << 20) / 4 + 3}}) {
      CAPTURE(threads);
      CAPTURE(n);
      set_num_threads(threads);
      Tensor a = Tensor::empty({n});
      Rng(7, "copy").fill_normal(a, 0.f, 1.f);
      Tensor b = Tensor::full({n}, -3.f);
      b.copy_from(a);
      CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
      b.fill(-0.f);
      b.zero();
      const float* q = b.data<float>();
      CHECK(std::all_of(q, q + n, [](float v) { return v == 0.f && !std::signbit(v); }));
      // Overlapping views of one buffer move as memmove moves them.
      const std::vector<float> original = a.to_vector();
      a.slice(0, n - 1).copy_from(a.slice(1, n));
      const float* r = a.data<float>();
      bool shifted = r[n - 1] == original[static_cast<std::size_t>(n - 1)];
      for (std::int64_t i = 0; i + 1 < n; ++i)
        shifted = shifted && r[i] == original[static_cast<std::size_t>(i + 1)];
      CHECK(shifted);
    }
  }
  set_num_threads(before);
}

}  // namespace test_tensor
