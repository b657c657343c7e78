// Deterministic random numbers, keyed by name.
//
// A layer's initial parameters are drawn from Rng(seed, "conv1.weight"): the stream depends only
// on the run's seed and the parameter's qualified name, never on which process, rank or order
// builds it. That is what lets a pipelined run, where each rank builds only its own stage, start
// from exactly the parameters of a single-process run. The generator is xoshiro256** seeded by
// SplitMix64; normals use Box–Muller written out here, because std::normal_distribution is not
// specified bit-for-bit across standard libraries.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace pipeline {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) { reseed(seed); }
  Rng(std::uint64_t seed, std::string_view key) { reseed(seed ^ hash(key)); }

  // FNV-1a: stable across platforms and compilers (std::hash is not).
  static constexpr std::uint64_t hash(std::string_view s) {
    std::uint64_t h = 14695981039346656037ull;
    for (char c : s) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
    return h;
  }

  std::uint64_t next_u64() {
    const std::uint64_t result = rotl(m_s[1] * 5, 7) * 9;
    const std::uint64_t t = m_s[1] << 17;
    m_s[2] ^= m_s[0];
    m_s[3] ^= m_s[1];
    m_s[1] ^= m_s[2];
    m_s[0] ^= m_s[3];
    m_s[2] ^= t;
    m_s[3] = rotl(m_s[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 24 bits, exactly representable as float.
  float uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next_u64() % n; }

  float normal(float mean = 0.f, float stddev = 1.f) {
    if (m_has_spare) {
      m_has_spare = false;
      return mean + stddev * m_spare;
    }
    double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    double a = 2.0 * std::numbers::pi * u2;
    m_spare = static_cast<float>(r * std::sin(a));
    m_has_spare = true;
    return mean + stddev * static_cast<float>(r * std::cos(a));
  }

  void fill_uniform(Tensor& t, float lo, float hi) {
    for (float& v : t.values()) v = uniform(lo, hi);
  }
  void fill_normal(Tensor& t, float mean, float stddev) {
    for (float& v : t.values()) v = normal(mean, stddev);
  }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  void reseed(std::uint64_t seed) {
    for (auto& s : m_s) {  // SplitMix64
      seed += 0x9e3779b97f4a7c15ull;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }

  std::uint64_t m_s[4];
  float m_spare = 0.f;
  bool m_has_spare = false;
};

}  // namespace pipeline
