#include "output_file.hpp"

#include <pipeline/core/output_path.hpp>

#include <pipeline/core/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace pipeline::detail {

namespace {

namespace fs = std::filesystem;

std::string directory_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// Where a file written to `path` lands: the path with its links followed (also a link to a file
// not yet there).
std::string destination_of(const std::string& path, bool exists) {
  std::error_code ec;
  if (exists) {
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) != nullptr) return resolved;
  } else if (fs::is_symlink(path, ec)) {
    const fs::path target = fs::read_symlink(path, ec);
    if (!ec)
      return (target.is_absolute() ? target : fs::path(directory_of(path)) / target).string();
  }
  return path;
}

// /dev/stdout and /proc/self/fd/N stand for a descriptor, possibly a shell's redirection into a
// regular file: replacing that file would take the output from under the redirection. FIFOs,
// devices and terminals cannot be replaced by a rename, and a reader may be waiting on them.
bool written_in_place(const std::string& path, const struct stat& st) {
  return !S_ISREG(st.st_mode) || path.starts_with("/dev/") || path.starts_with("/proc/");
}

// A fresh name beside `dest` for the file that replaces it whole.
std::string temporary_beside(const std::string& dest) {
  static std::atomic<unsigned> counter{0};
  const fs::path d(dest);
  return (fs::path(directory_of(dest)) /
          ("." + d.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
           std::to_string(counter.fetch_add(1))))
      .string();
}

// What output_path_problem() finds without creating anything: the checks OutputFile repeats
// before it creates its temporary (whose failure says the rest).
std::string problem_before_creating(const std::string& path) {
  if (path.empty()) return "an output file needs a path";
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode))
    return "cannot write '" + path + "': it is a directory; name a file inside it";
  if (exists && written_in_place(path, st))
    return ::access(path.c_str(), W_OK) == 0
               ? std::string()
               : "cannot write '" + path + "': " + std::strerror(errno);
  const std::string dir = directory_of(destination_of(path, exists));
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0)
    return "cannot write '" + path + "': directory '" + dir + "' does not exist (create it first)";
  if (!S_ISDIR(dst.st_mode))
    return "cannot write '" + path + "': '" + dir + "' is a file, not a directory";
  if (::access(dir.c_str(), W_OK) != 0)
    return "cannot write '" + path + "': directory '" + dir + "' is not writable";
  return {};
}

// Why the file `created` beside `path`'s destination could not be made (errno `err`).
std::string creation_problem(const std::string& path, const std::string& created, int err) {
  return "cannot write '" + path + "': " + std::strerror(err) + " (creating a file in '" +
         directory_of(created) + "')" + (err == ENAMETOOLONG ? "; give it a shorter name" : "");
}

}  // namespace

}  // namespace pipeline::detail

namespace pipeline {

std::string output_path_problem(const std::string& path) {
  if (std::string problem = detail::problem_before_creating(path); !problem.empty()) return problem;
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && detail::written_in_place(path, st)) return {};
  // The rest shows only on trying (a name too long once the temporary's suffix is added, a file
  // system that takes no new files such as /proc or a read-only mount): a probe file, made and
  // removed at once, as OutputFile makes its temporary.
  const std::string probe = detail::temporary_beside(detail::destination_of(path, exists));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return detail::creation_problem(path, probe, errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

}  // namespace pipeline

namespace pipeline::detail {

OutputFile::OutputFile(std::string path) : m_path(std::move(path)), m_dest(m_path) {
  if (const std::string problem = problem_before_creating(m_path); !problem.empty())
    PIPELINE_FAIL(IoError, "{}", problem);
  struct stat st {};
  const bool exists = ::stat(m_path.c_str(), &st) == 0;  // follows links
  if (exists && written_in_place(m_path, st)) {
    m_fd = ::open(m_path.c_str(), O_WRONLY | O_CLOEXEC);
    PIPELINE_CHECK_AS(IoError, m_fd >= 0, "cannot open '{}' for writing: {}", m_path,
                      std::strerror(errno));
    return;
  }
  m_dest = destination_of(m_path, exists);
  m_tmp = temporary_beside(m_dest);
  m_fd = ::open(m_tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (m_fd < 0) PIPELINE_FAIL(IoError, "{}", creation_problem(m_path, m_tmp, errno));
}

OutputFile::~OutputFile() {
  if (m_fd >= 0) ::close(m_fd);
  if (!m_tmp.empty()) ::unlink(m_tmp.c_str());
}

void OutputFile::fail(const char* what, int err) {
  if (m_fd >= 0) ::close(m_fd);
  m_fd = -1;
  if (!m_tmp.empty()) ::unlink(m_tmp.c_str());
  m_tmp.clear();
  PIPELINE_FAIL(IoError, "writing '{}' failed while {}: {}{}", m_path, what, std::strerror(err),
                err == ENOSPC || err == EDQUOT ? " (the disk is full)" : "");
}

void OutputFile::write(const void* data, std::size_t n, const char* what) {
  PIPELINE_CHECK(m_fd >= 0, "OutputFile::write after commit of '{}'", m_path);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(m_fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(what, w < 0 ? errno : EIO);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void OutputFile::commit() {
  PIPELINE_CHECK(m_fd >= 0, "OutputFile::commit twice for '{}'", m_path);
  if (m_tmp.empty()) {  // written in place
    const int fd = m_fd;
    m_fd = -1;
    PIPELINE_CHECK_AS(IoError, ::close(fd) == 0, "writing '{}' failed while closing: {}", m_path,
                      std::strerror(errno));
    return;
  }
  if (::fsync(m_fd) != 0) fail("flushing to disk", errno);
  const int fd = m_fd;
  m_fd = -1;
  if (::close(fd) != 0) fail("closing", errno);
  if (::rename(m_tmp.c_str(), m_dest.c_str()) != 0) {
    const int err = errno;
    ::unlink(m_tmp.c_str());
    m_tmp.clear();
    PIPELINE_FAIL(IoError, "cannot move the new '{}' into place: {}", m_path, std::strerror(err));
  }
  m_tmp.clear();
  // Make the rename itself durable; failing here leaves a complete file, so it is not an error.
  if (const int dfd = ::open(directory_of(m_dest).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  OutputFile out(path);
  out.write(text);
  out.commit();
}

}  // namespace pipeline::detail
