// Writing an output file so that a reader never sees half of it. Internal to the library: every
// file the library writes (plans, profiles, traces, schedules, checkpoints) goes through here.
#pragma once

#include <cstddef>
#include <string>

namespace pipeline::detail {

// A regular file (or a new one) is written to a hidden temporary beside it, flushed to disk and
// renamed over it by commit(): after a crash the path holds the old file or the whole new one.
// A symbolic link is followed (the file it names is replaced, the link stays); a FIFO, a device
// or a terminal (/dev/stdout) is written in place, where a rename cannot go. Destroyed before
// commit(), the temporary is removed and the destination left as it was.
class OutputFile {
 public:
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Appends n bytes; an IoError naming the path (and what was being written) when that fails.
  void write(const void* data, std::size_t n, const char* what = "writing");
  void write(const std::string& text) { write(text.data(), text.size()); }
  // Flushes, closes and moves the file into place.
  void commit();

 private:
  [[noreturn]] void fail(const char* what, int err);

  std::string m_path;  // as the caller named it, for messages
  std::string m_dest;  // where the file lands: the path with its links followed
  std::string m_tmp;   // empty when written in place
  int m_fd = -1;
};

// OutputFile(path).write(text).commit().
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace pipeline::detail
