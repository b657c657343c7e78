// xoshiro256** as pipeline::Rng draws it, with jump-ahead, so that a GPU thread can start the
// generator at any position of the stream without drawing everything before it.
//
// The CPU dropout op draws its mask serially from Rng(seed, key): element i takes the i-th draw.
// xoshiro256**'s state transition is linear over GF(2) (shifts, rotations and xors of the 256
// state bits), so advancing it by d draws is multiplying the state by the 256 × 256 bit matrix
// M^d. jump_table() builds M^(kJump · 2^b) for b < kLevels once on the host; a thread that
// starts at draw k · kJump multiplies the seeded state by the tables of k's set bits (they are
// powers of one matrix, so their order does not matter) and then steps serially. The output
// function (rotl(s1 · 5, 7) · 9) is not linear, but it only reads the state, so every draw is
// exactly the CPU's.
//
// Host and device code (plain C++ when not compiled by nvcc, so a host test can check the jumps
// against pipeline::Rng). Seeding and stepping must stay identical to
// include/pipeline/core/rng.hpp.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define PIPELINE_HOST_DEVICE __host__ __device__
#else
#define PIPELINE_HOST_DEVICE
#endif

namespace pipeline::kernels::xoshiro {

constexpr int kJumpLog2 = 10;
constexpr std::int64_t kJump = std::int64_t{1} << kJumpLog2;  // draws between thread starts
constexpr int kLevels = 32;  // jump tables: starts up to kJump · 2^kLevels (2^42 draws)
constexpr int kWordsPerMatrix = 256 * 4;  // 256 columns of 256 bits

struct State {
  std::uint64_t s[4];
};

PIPELINE_HOST_DEVICE inline std::uint64_t rotl(std::uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// Rng::reseed: four SplitMix64 outputs. `seed` is already seed ^ Rng::hash(key).
PIPELINE_HOST_DEVICE inline State seeded(std::uint64_t seed) {
  State st;
  for (auto& s : st.s) {
    seed += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s = z ^ (z >> 31);
  }
  return st;
}

// Rng::next_u64.
PIPELINE_HOST_DEVICE inline std::uint64_t next(State& st) {
  std::uint64_t* s = st.s;
  const std::uint64_t result = rotl(s[1] * 5, 7) * 9;
  const std::uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

// Rng::uniform: 24 bits, exactly representable.
PIPELINE_HOST_DEVICE inline float uniform(State& st) {
  return static_cast<float>(next(st) >> 40) * 0x1.0p-24f;
}

// matrix · x over GF(2); column j (state bit j = word j / 64, bit j % 64) is
// cols[4j .. 4j + 4).
PIPELINE_HOST_DEVICE inline State apply(const std::uint64_t* cols, const State& x) {
  State r{{0, 0, 0, 0}};
  for (int w = 0; w < 4; ++w) {
    std::uint64_t word = x.s[w];
    while (word != 0) {
#if defined(__CUDA_ARCH__)
      const int bit = __ffsll(static_cast<long long>(word)) - 1;
#else
      const int bit = std::countr_zero(word);
#endif
      word &= word - 1;
      const std::uint64_t* c = cols + 4 * (64 * w + bit);
      r.s[0] ^= c[0];
      r.s[1] ^= c[1];
      r.s[2] ^= c[2];
      r.s[3] ^= c[3];
    }
  }
  return r;
}

// Advances `st` by k · kJump draws with the tables of jump_table().
PIPELINE_HOST_DEVICE inline State jump(const std::uint64_t* tables, State st, std::uint64_t k) {
  for (int b = 0; k != 0 && b < kLevels; ++b, k >>= 1)
    if (k & 1) st = apply(tables + static_cast<std::size_t>(b) * kWordsPerMatrix, st);
  return st;
}

// kLevels matrices, M^(kJump · 2^b) for b = 0, 1, ..., each kWordsPerMatrix words (host).
inline std::vector<std::uint64_t> jump_table() {
  std::vector<std::uint64_t> m(kWordsPerMatrix);
  // M itself: column j is one step applied to the unit state e_j.
  for (int j = 0; j < 256; ++j) {
    State e{{0, 0, 0, 0}};
    e.s[j / 64] = std::uint64_t{1} << (j % 64);
    next(e);
    for (int w = 0; w < 4; ++w) m[4 * j + w] = e.s[w];
  }
  // Squaring: column j of A² is A applied to column j of A.
  const auto square = [](const std::vector<std::uint64_t>& a) {
    std::vector<std::uint64_t> r(kWordsPerMatrix);
    for (int j = 0; j < 256; ++j) {
      const State c{{a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3]}};
      const State s = apply(a.data(), c);
      for (int w = 0; w < 4; ++w) r[4 * j + w] = s.s[w];
    }
    return r;
  };
  for (int i = 0; i < kJumpLog2; ++i) m = square(m);
  std::vector<std::uint64_t> tables(static_cast<std::size_t>(kLevels) * kWordsPerMatrix);
  for (int b = 0; b < kLevels; ++b) {
    std::copy(m.begin(), m.end(),
              tables.begin() + static_cast<std::ptrdiff_t>(b) * kWordsPerMatrix);
    if (b + 1 < kLevels) m = square(m);
  }
  return tables;
}

}  // namespace pipeline::kernels::xoshiro
