#include <pipeline/core/rng.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/ops/gemm.hpp>

#include <doctest/doctest.h>

#include "../../src/ops/short_product.hpp"
#include "../../src/ops/split_product.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace test_gemm {

using namespace pipeline;

namespace {
Tensor random(Shape s, std::uint64_t seed) {
  Tensor t = Tensor::empty(s);
  Rng(seed).fill_uniform(t, -1, 1);
  return t;
}
float at(const Tensor& t, std::int64_t i, std::int64_t j, bool trans) {
  return trans ? t.data<float>()[j * t.dim(1) + i] : t.data<float>()[i * t.dim(1) + j];
}

// op(A) · op(B) in double, with the sum of its terms' magnitudes (the scale of each element's
// rounding): A's rows and B's columns gathered first so that the inner loop runs over contiguous
// memory (the sanitizer builds run it too).
struct ExactProduct {
  std::int64_t m, n;
  std::vector<double> value, size;

  ExactProduct(const Tensor& a, bool ta, const Tensor& b, bool tb)
      : m(ta ? a.dim(1) : a.dim(0)), n(tb ? b.dim(0) : b.dim(1)) {
    const std::int64_t k = ta ? a.dim(0) : a.dim(1);
    std::vector<double> rows(static_cast<std::size_t>(m * k)),
        cols(static_cast<std::size_t>(n * k));
    for (std::int64_t p = 0; p < k; ++p) {
      for (std::int64_t i = 0; i < m; ++i) rows[i * k + p] = at(a, i, p, ta);
      for (std::int64_t j = 0; j < n; ++j) cols[j * k + p] = at(b, p, j, tb);
    }
    value.resize(static_cast<std::size_t>(m * n));
    size.resize(value.size());
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const double* x = &rows[i * k];
        const double* y = &cols[j * k];
        double sum = 0, magnitude = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          sum += x[p] * y[p];
          magnitude += std::abs(x[p] * y[p]);
        }
        value[i * n + j] = sum;
        size[i * n + j] = magnitude;
      }
  }

  // The largest error of c = alpha · op(A) · op(B) + beta · c0, relative to each element's scale
  // (1 for a NaN: an element the product left unwritten).
  double worst_error(const Tensor& c, float alpha, float beta, const Tensor& c0) const {
    const float* got = c.data<float>();
    const float* before = c0.data<float>();
    double worst = 0;
    for (std::int64_t e = 0; e < m * n; ++e) {
      const double ref = alpha * value[e] + beta * before[e];
      const double err = std::abs(got[e] - ref) / (std::abs(alpha) * size[e] + 1);
      worst = std::max(worst, std::isnan(err) ? 1.0 : err);
    }
    return worst;
  }
};
}  // namespace

TEST_CASE("gemm matches the naive triple loop for every transpose and beta") {
  const std::int64_t m = 7, k = 13, n = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 1.f, 0.5f}) {
        Tensor a = ta ? random({k, m}, 1) : random({m, k}, 1);
        Tensor b = tb ? random({n, k}, 2) : random({k, n}, 2);
        Tensor c = random({m, n}, 3);
        Tensor c0 = c.clone();
        ops::gemm(a, ta, b, tb, c, 0.75f, beta);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            double ref = 0;
            for (std::int64_t p = 0; p < k; ++p) ref += at(a, i, p, ta) * at(b, p, j, tb);
            ref = 0.75 * ref + beta * c0.data<float>()[i * n + j];
            CHECK(c.data<float>()[i * n + j] == doctest::Approx(ref).epsilon(1e-5));
          }
      }
}

TEST_CASE("products split over threads, by rows or by columns, equal the naive triple loop") {
  // Large enough that 4 threads each get a block: tall C (split by rows), wide C (by columns),
  // sizes that are not multiples of the 16-float blocks, every transpose.
  const int was = num_threads();
  struct Case {
    std::int64_t m, k, n;
  };
  for (const int threads : {1, 3, 4})
    for (const Case s : {Case{517, 70, 33}, Case{40, 90, 1001}, Case{129, 257, 130}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          set_num_threads(threads);
          Tensor a = ta ? random({s.k, s.m}, 4) : random({s.m, s.k}, 4);
          Tensor b = tb ? random({s.n, s.k}, 5) : random({s.k, s.n}, 5);
          Tensor c = random({s.m, s.n}, 6);
          Tensor c0 = c.clone();
          ops::gemm(a, ta, b, tb, c, 0.5f, 1.f);
          CAPTURE(threads);
          CAPTURE(s.m);
          CAPTURE(s.n);
          CHECK(ExactProduct(a, ta, b, tb).worst_error(c, 0.5f, 1.f, c0) < 1e-6);
        }
  set_num_threads(was);
}

TEST_CASE(
    "Eigen's product over the thread's reused packing buffers is Eigen's product, bit for bit") {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  struct Case {
    Eigen::Index m, k, n;
  };
  // Growing and shrinking buffers (large after small, small after large), a row and a column
  // result and shapes under Eigen's coefficient-based threshold (Eigen's own path), every
  // transpose; on the calling thread and on a worker thread of a parallel region.
  const Case cases[] = {{3, 4, 5},      {64, 784, 256},  {7, 9, 11},
                        {1, 300, 40},   {300, 40, 1},    {517, 70, 33},
                        {40, 90, 1001}, {64, 3136, 512}, {129, 257, 130}};
  const auto check = [&] {
    for (const Case c : cases)
      for (const bool ta : {false, true})
        for (const bool tb : {false, true}) {
          CAPTURE(c.m);
          CAPTURE(c.k);
          CAPTURE(c.n);
          const Mat a = ta ? Mat::Random(c.k, c.m) : Mat::Random(c.m, c.k);
          const Mat b = tb ? Mat::Random(c.n, c.k) : Mat::Random(c.k, c.n);
          const Mat c0 = Mat::Random(c.m, c.n);
          Mat want = c0, got = c0;
          const ops::detail::EigenOnThisThread one;
          if (ta && tb) {
            want.noalias() += 0.5f * (a.transpose() * b.transpose());
            ops::detail::product_add(got, a.transpose(), b.transpose(), 0.5f);
          } else if (ta) {
            want.noalias() += 0.5f * (a.transpose() * b);
            ops::detail::product_add(got, a.transpose(), b, 0.5f);
          } else if (tb) {
            want.noalias() += 0.5f * (a * b.transpose());
            ops::detail::product_add(got, a, b.transpose(), 0.5f);
          } else {
            want.noalias() += 0.5f * (a * b);
            ops::detail::product_add(got, a, b, 0.5f);
          }
          CHECK(std::equal(want.data(), want.data() + want.size(), got.data()));
          if (!ta && !tb) {  // a block of a larger result (outer stride past its width)
            Mat wide = Mat::Zero(c.m, c.n + 3), wide_want = wide;
            wide_want.leftCols(c.n).noalias() += 0.5f * (a * b);
            ops::detail::product_add(wide.leftCols(c.n), a, b, 0.5f);
            CHECK(std::equal(wide_want.data(), wide_want.data() + wide_want.size(), wide.data()));
          }
        }
  };
  check();
  const int was = num_threads();
  set_num_threads(2);
  pipeline::detail::on_threads(2, [&](int t) {
    if (t == 1) check();
  });
  set_num_threads(was);
}

namespace {
// C = 0.5 · op(A) · op(B) + beta · C0, C overwritten (poisoned with NaN: it must not be read) or
// accumulated, on 1 and 3 threads: within 1e-6 of the naive double loop (normalised by the
// terms' size) and, where the short-product kernels run (their promise; Eigen's blocks follow
// the thread count), the same bits on both.
void check_short_product(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c0) {
  const int was = num_threads();
  const std::int64_t m = c0.dim(0), n = c0.dim(1);
  const ExactProduct exact(a, ta, b, tb);
  for (const float beta : {0.f, 1.f}) {
    CAPTURE(beta);
    Tensor first;
    for (const int threads : {1, 3}) {
      set_num_threads(threads);
      Tensor c = beta == 0.f ? Tensor::full({m, n}, std::nanf("")) : c0.clone();
      ops::gemm(a, ta, b, tb, c, 0.5f, beta);
      if (first.defined()) {
        if (ops::detail::short_product_kernel())
          CHECK(std::equal(c.data<float>(), c.data<float>() + c.numel(), first.data<float>()));
        continue;
      }
      first = c;
      CHECK(exact.worst_error(c, 0.5f, beta, c0) < 1e-6);
    }
  }
  set_num_threads(was);
}
}  // namespace

// A Linear layer's three products over a batch of at most 64 rows and a weight past 4 MiB take
// the AVX-512 kernels where the build has them (ops/short_product.hpp): x · Wᵀ and dy · W for
// row counts of every vector width and partial tile, dyᵀ · x for every depth its tiles meet;
// column counts that leave partial tiles and vectors.
TEST_CASE("a short batch times a long weight (x · Wᵀ, dy · W, dyᵀ · x) equals the naive loop") {
  const std::int64_t k = 1031, n = 1021;  // n · k past 2^20 floats; n not a multiple of any tile
  for (const bool trans_b : {true, false}) {
    const Tensor w = trans_b ? random({n, k}, 7) : random({k, n}, 7);
    for (const std::int64_t m : {1, 7, 16, 17, 40, 64}) {
      CAPTURE(trans_b);
      CAPTURE(m);
      check_short_product(random({m, k}, 8), false, w, trans_b, random({m, n}, 9));
    }
  }
  for (const std::int64_t depth : {1, 7, 16, 17, 40, 64}) {  // the weight gradient: C 1021 x 1031
    CAPTURE(depth);
    check_short_product(random({depth, n}, 10), true, random({depth, k}, 11), false,
                        random({n, k}, 12));
  }
}

TEST_CASE("gemm rejects mismatched shapes") {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5}), c = Tensor::zeros({2, 5});
  CHECK_THROWS_WITH(ops::gemm(a, false, b, false, c), doctest::Contains("do not agree"));
}

// Each product picks its own thread count for the calling thread (small products run on fewer
// threads than num_threads()) and must hand the thread back its OpenMP count unchanged, or every
// later parallel region of that thread would run on the product's count. Eigen follows the calling
// thread's count: set_num_threads leaves Eigen's process-wide setting alone.
TEST_CASE("a product leaves the calling thread's OpenMP thread count as it found it") {
#ifdef _OPENMP
  const int was = num_threads();
  set_num_threads(2);
  CHECK(omp_get_max_threads() == 2);
  CHECK(Eigen::nbThreads() == 2);
  Rng rng(11, "threads");
  for (const std::int64_t n : {std::int64_t{4}, std::int64_t{300}}) {
    Tensor a = Tensor::empty(Shape{n, n}), b = Tensor::empty(Shape{n, n});
    for (float& v : a.values()) v = rng.uniform(-1.f, 1.f);
    for (float& v : b.values()) v = rng.uniform(-1.f, 1.f);
    (void)ops::matmul(a, false, b, true);
    CHECK(omp_get_max_threads() == 2);
    omp_set_num_threads(3);  // a caller's own count survives too
    (void)ops::matmul(a, true, b, false);
    CHECK(omp_get_max_threads() == 3);
    set_num_threads(2);
  }
  set_num_threads(was);
#endif
}

}  // namespace test_gemm
