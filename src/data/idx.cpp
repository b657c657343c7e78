#include <pipeline/data/idx.hpp>

#include <pipeline/core/error.hpp>

#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

namespace pipeline {

namespace {

struct GzCloser {
  void operator()(gzFile f) const noexcept { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to n bytes; returns how many were read. Corrupt compressed data throws.
std::size_t read_some(gzFile f, std::uint8_t* dst, std::size_t n, const std::string& path) {
  std::size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
    const int got = gzread(f, dst + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      PIPELINE_FAIL(IoError, "IDX file '{}' is truncated or corrupt: {}", path,
                    msg ? msg : "read error");
    }
    if (got == 0) {
      // A gzip stream cut short reports Z_BUF_ERROR only after the read that hits the end.
      int code = 0;
      const char* msg = gzerror(f, &code);
      if (code != Z_OK && code != Z_STREAM_END)
        PIPELINE_FAIL(IoError, "IDX file '{}' is truncated or corrupt: {}", path,
                      msg ? msg : "read error");
      break;
    }
    done += static_cast<std::size_t>(got);
  }
  return done;
}

GzFile open_idx(const std::string& path) {
  PIPELINE_CHECK_AS(IoError, std::filesystem::is_regular_file(path),
                    "IDX file '{}' does not exist or is not a regular file", path);
  GzFile f(gzopen(path.c_str(), "rb"));
  PIPELINE_CHECK_AS(IoError, f != nullptr, "cannot open IDX file '{}': {}", path,
                    std::strerror(errno));
  gzbuffer(f.get(), 1 << 20);
  return f;
}

// The header's dimensions, every check of it made; `f` is left at the first element.
std::vector<std::int64_t> read_header(gzFile f, const std::string& path) {
  std::uint8_t magic[4];
  PIPELINE_CHECK_AS(IoError, read_some(f, magic, 4, path) == 4,
                    "IDX file '{}' is too short to hold a header", path);
  PIPELINE_CHECK_AS(IoError, magic[0] == 0 && magic[1] == 0,
                    "'{}' is not an IDX file: bad magic {:02x} {:02x} {:02x} {:02x}", path,
                    magic[0], magic[1], magic[2], magic[3]);
  PIPELINE_CHECK_AS(IoError, magic[2] == 0x08,
                    "IDX file '{}' has element type 0x{:02x}; only unsigned bytes (0x08) are "
                    "supported",
                    path, magic[2]);
  const int rank = magic[3];
  PIPELINE_CHECK_AS(IoError, rank >= 1 && rank <= 8,
                    "IDX file '{}' declares {} dimensions; expected 1 to 8", path, rank);

  std::vector<std::int64_t> dims;
  std::uint8_t raw[4 * 8];
  PIPELINE_CHECK_AS(IoError,
                    read_some(f, raw, 4 * static_cast<std::size_t>(rank), path) ==
                        4 * static_cast<std::size_t>(rank),
                    "IDX file '{}' is truncated inside its {} dimension sizes", path, rank);
  std::int64_t total = 1;
  for (int d = 0; d < rank; ++d) {
    const std::uint8_t* b = raw + 4 * d;
    const std::int64_t n = (std::int64_t{b[0]} << 24) | (std::int64_t{b[1]} << 16) |
                           (std::int64_t{b[2]} << 8) | std::int64_t{b[3]};
    dims.push_back(n);
    PIPELINE_CHECK_AS(IoError, n == 0 || total <= (std::int64_t{1} << 40) / n,
                      "IDX file '{}' declares an implausible size (dimensions so far: {})", path,
                      fmt::join(dims, " x "));
    total *= n;
  }
  return dims;
}

}  // namespace

std::vector<std::int64_t> read_idx_dims(const std::string& path) {
  const GzFile f = open_idx(path);
  return read_header(f.get(), path);
}

IdxArray read_idx(const std::string& path) {
  const GzFile f = open_idx(path);
  IdxArray out;
  out.dims = read_header(f.get(), path);
  const std::int64_t total = out.numel();

  // The declared size is allocated at once where the file could hold it: deflate expands data
  // at most 1032-fold. A header that lies beyond that gets a buffer grown as data arrives
  // (doubling from 1 MiB, in steps of at most 64 MiB), so it cannot make us allocate much more
  // than the file holds. (Growing every buffer so took nearly half of a 47 MB read, and twice its
  // memory.)
  const std::size_t expected = static_cast<std::size_t>(total);
  const std::size_t file_bytes = static_cast<std::size_t>(std::filesystem::file_size(path));
  const bool plausible = expected / 1032 <= file_bytes;
  std::size_t have = 0;
  while (have < expected) {
    const std::size_t step =
        plausible ? expected
                  : std::clamp<std::size_t>(have, std::size_t{1} << 20, std::size_t{64} << 20);
    const std::size_t chunk = std::min<std::size_t>(expected - have, step);
    out.data.resize(have + chunk);
    const std::size_t got = read_some(f.get(), out.data.data() + have, chunk, path);
    have += got;
    if (got < chunk) break;
  }
  PIPELINE_CHECK_AS(IoError, have == expected,
                    "IDX file '{}' is truncated: its header declares {} ({} bytes of data) but "
                    "only {} bytes follow",
                    path, fmt::join(out.dims, " x "), expected, have);
  std::uint8_t extra;
  PIPELINE_CHECK_AS(IoError, read_some(f.get(), &extra, 1, path) == 0,
                    "IDX file '{}' has data beyond the {} bytes its header declares ({}); the file "
                    "is corrupt or not what it claims",
                    path, expected, fmt::join(out.dims, " x "));
  return out;
}

void write_idx(const std::string& path, const IdxArray& array, bool gzip) {
  PIPELINE_CHECK(!array.dims.empty() && array.dims.size() <= 8,
                 "write_idx: {} dimensions; IDX holds 1 to 8", array.dims.size());
  PIPELINE_CHECK(static_cast<std::size_t>(array.numel()) == array.data.size(),
                 "write_idx: dimensions hold {} elements but {} were given", array.numel(),
                 array.data.size());
  std::vector<std::uint8_t> bytes{0, 0, 0x08, static_cast<std::uint8_t>(array.dims.size())};
  for (auto d : array.dims) {
    PIPELINE_CHECK(d >= 0 && d <= 0xffffffffLL, "write_idx: dimension {} out of range", d);
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<std::uint8_t>((d >> s) & 0xff));
  }
  bytes.insert(bytes.end(), array.data.begin(), array.data.end());

  GzFile f(gzopen(path.c_str(), gzip ? "wb6" : "wbT"));  // T: write uncompressed
  PIPELINE_CHECK_AS(IoError, f != nullptr, "cannot create IDX file '{}': {}", path,
                    std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const unsigned chunk =
        static_cast<unsigned>(std::min<std::size_t>(bytes.size() - done, 1u << 30));
    const int put = gzwrite(f.get(), bytes.data() + done, chunk);
    PIPELINE_CHECK_AS(IoError, put > 0, "writing IDX file '{}' failed", path);
    done += static_cast<std::size_t>(put);
  }
  PIPELINE_CHECK_AS(IoError, gzclose(f.release()) == Z_OK, "closing IDX file '{}' failed", path);
}

}  // namespace pipeline
