#include "json_io.hpp"

#include <pipeline/core/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace pipeline::detail {

nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              std::string_view empty_hint) {
  std::ifstream in(path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open {} '{}' for reading", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), path, empty_hint);
}

nlohmann::json parse_json_text(std::string_view text, std::string_view origin,
                               std::string_view empty_hint) {
  PIPELINE_CHECK_AS(ConfigError, text.find_first_not_of(" \t\r\n") != std::string_view::npos,
                    "{}: the file is empty{}", origin, empty_hint);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PIPELINE_FAIL(ConfigError, "{}: malformed JSON: {}", origin, e.what());
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  // Temporary file, fsync, rename, directory fsync: after a crash the path holds either the old
  // file or the whole new one, and once this returns the new one survives a power loss.
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PIPELINE_CHECK_AS(IoError, fd >= 0, "cannot open '{}' for writing: {}", tmp,
                    std::strerror(errno));
  std::size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    ok = w > 0;
    if (ok) done += static_cast<std::size_t>(w);
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    PIPELINE_FAIL(IoError, "writing '{}' failed (disk full?): {}", tmp, std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    PIPELINE_FAIL(IoError, "cannot rename '{}' to '{}'", tmp, path);
  }
  const auto slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, std::max<std::size_t>(slash, 1));
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace pipeline::detail
