#include <pipeline/core/error.hpp>
#include <pipeline/core/output_path.hpp>

#include "../../src/core/output_file.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace test_output_file {

namespace fs = std::filesystem;
using pipeline::IoError;
using pipeline::detail::OutputFile;
using pipeline::detail::write_file_atomically;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The directory's entries, so that a test can tell no temporary stayed behind.
int entries(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

struct ScratchDir {
  fs::path path =
      fs::temp_directory_path() / ("pipeline_test_output_file." + std::to_string(::getpid()));
  ScratchDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
};

TEST_CASE("an output replaces a file whole and leaves nothing beside it") {
  ScratchDir d;
  const fs::path f = d.path / "plan.json";
  write_file_atomically(f.string(), "old");
  write_file_atomically(f.string(), "new text");
  CHECK(slurp(f) == "new text");
  CHECK(entries(d.path) == 1);
  {  // abandoned before commit: the old file stays, the temporary goes
    OutputFile out(f.string());
    out.write(std::string("half"));
  }
  CHECK(slurp(f) == "new text");
  CHECK(entries(d.path) == 1);
}

TEST_CASE("a symbolic link is followed: the file it names is replaced, the link stays") {
  ScratchDir d;
  fs::create_directories(d.path / "real");
  const fs::path target = d.path / "real" / "plan.json", link = d.path / "link.json";
  write_file_atomically(target.string(), "old");
  fs::create_symlink(fs::path("real") / "plan.json", link);  // relative, as ln -s makes them
  write_file_atomically(link.string(), "through the link");
  CHECK(fs::is_symlink(link));
  CHECK(slurp(target) == "through the link");
  CHECK(entries(d.path / "real") == 1);
  // A link to a file not there yet creates it.
  const fs::path dangling = d.path / "dangling.json";
  fs::create_symlink(fs::path("real") / "new.json", dangling);
  write_file_atomically(dangling.string(), "created");
  CHECK(fs::is_symlink(dangling));
  CHECK(slurp(d.path / "real" / "new.json") == "created");
}

TEST_CASE("a FIFO is written in place for the reader waiting on it") {
  ScratchDir d;
  const fs::path fifo = d.path / "out.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string got;
  std::thread reader([&] { got = slurp(fifo); });
  write_file_atomically(fifo.string(), "streamed");
  reader.join();
  CHECK(got == "streamed");
  CHECK(fs::is_fifo(fifo));
  CHECK(entries(d.path) == 1);
}

TEST_CASE("outputs that cannot be written name the path and the reason") {
  ScratchDir d;
  CHECK_THROWS_WITH_AS(write_file_atomically(d.path.string(), "x"),
                       doctest::Contains("it is a directory; name a file inside it"), IoError);
  const std::string missing = "cannot write '" + (d.path / "missing" / "x.json").string() +
                              "': directory '" + (d.path / "missing").string() +
                              "' does not exist (create it first)";
  CHECK_THROWS_WITH_AS(write_file_atomically((d.path / "missing" / "x.json").string(), "x"),
                       doctest::Contains(missing.c_str()), IoError);
  write_file_atomically((d.path / "plain").string(), "a file");
  const std::string not_dir = "'" + (d.path / "plain").string() + "' is a file, not a directory";
  CHECK_THROWS_WITH_AS(write_file_atomically((d.path / "plain" / "x.json").string(), "x"),
                       doctest::Contains(not_dir.c_str()), IoError);
  if (::geteuid() != 0) {  // root writes anywhere
    fs::permissions(d.path, fs::perms::owner_read | fs::perms::owner_exec);
    CHECK_THROWS_WITH_AS(write_file_atomically((d.path / "x.json").string(), "x"),
                         doctest::Contains("is not writable"), IoError);
    fs::permissions(d.path, fs::perms::owner_all);
  }
  // Found only on trying, and found before any work: a name too long once the temporary's suffix
  // is added, a file system that takes no new files. Nothing is left in the directory.
  const std::string long_name = (d.path / (std::string(250, 'a') + ".json")).string();
  const std::string too_long = pipeline::output_path_problem(long_name);
  CHECK(too_long.find("give it a shorter name") != std::string::npos);
  CHECK_THROWS_WITH_AS(write_file_atomically(long_name, "x"),
                       doctest::Contains("give it a shorter name"), IoError);
  if (fs::exists("/proc/self")) CHECK(!pipeline::output_path_problem("/proc/p.json").empty());
  CHECK(pipeline::output_path_problem((d.path / "fine.json").string()).empty());
  CHECK(entries(d.path) == 1);    // "plain" alone: no probe stayed
  if (fs::exists("/dev/full")) {  // a device written in place; the full disk is named
    CHECK_THROWS_WITH_AS(write_file_atomically("/dev/full", "x"),
                         doctest::Contains("the disk is full"), IoError);
  }
}

}  // namespace test_output_file
