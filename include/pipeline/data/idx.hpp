// The IDX file format of MNIST and Fashion-MNIST: a 4-byte magic (0, 0, element type, number of
// dimensions), the dimensions as big-endian uint32, then the elements, row-major.
//
// read_idx() accepts plain and gzip-compressed files alike (zlib reads both) and checks
// everything: magic, element type (only unsigned bytes, 0x08, are supported), dimension count,
// declared sizes against the data actually present, and trailing data. Every problem throws
// IoError naming the file. write_idx() writes unsigned-byte files (tests, tools).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;  // row-major, product(dims) elements

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
};

IdxArray read_idx(const std::string& path);
// The dimensions alone, from the header (checked as read_idx checks it; the data is not read).
std::vector<std::int64_t> read_idx_dims(const std::string& path);
void write_idx(const std::string& path, const IdxArray& array, bool gzip);

}  // namespace pipeline
