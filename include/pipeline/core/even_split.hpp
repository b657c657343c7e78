// [0, n) cut into `parts` contiguous parts whose sizes differ by at most one: the first n % parts
// parts are one longer. Threads split loops this way (OpenMP's static schedule) and minibatches
// are cut into microbatches this way, so a count fixes who gets which items.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pipeline {

struct IndexRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};

// Part i of [0, n) cut into `parts` parts (1 <= parts, 0 <= i < parts).
inline IndexRange even_part(std::int64_t n, std::int64_t parts, std::int64_t i) {
  const std::int64_t q = n / parts, r = n % parts;
  const std::int64_t begin = i * q + std::min(i, r);
  return {begin, begin + q + (i < r ? 1 : 0)};
}

}  // namespace pipeline
