// Stop signals: the first SIGTERM or SIGINT only sets the flag (the process keeps running and can
// checkpoint); a SIGINT after it ends the process through the handler installed before, or the
// default action, and a repeated SIGTERM (a scheduler's and mpirun's) changes nothing. Each case
// runs in a forked child, since the second signal kills it.
#include <doctest/doctest.h>

#include <pipeline/runtime/preemption.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <initializer_list>

namespace test_preemption {

using namespace pipeline;

namespace {

// Runs `child` in a forked process and returns its wait status.
template <typename Fn>
int in_child(Fn child) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    child();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("preemption: the first signal sets the flag, a SIGINT after it ends the process") {
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    const int status = in_child([sig] {
      // As in a fresh process: the handler before ours is the default action (not the test
      // runner's crash reporter, inherited from the parent, which is not async-signal-safe).
      std::signal(SIGTERM, SIG_DFL);
      std::signal(SIGINT, SIG_DFL);
      catch_preemption_signals();
      catch_preemption_signals();  // idempotent
      if (preemption_requested() || preemption_signal() != 0) ::_exit(10);
      std::raise(sig);
      if (!preemption_requested() || preemption_signal() != sig) ::_exit(11);
      std::raise(SIGINT);  // ends the process with the default action
      ::_exit(12);
    });
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGINT);
    if (WIFEXITED(status)) FAIL_CHECK("child exited with ", WEXITSTATUS(status));
  }
}

TEST_CASE("preemption: a signal ignored at the start stays ignored") {
  const int status = in_child([] {
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_IGN);  // a background job of a non-interactive shell
    catch_preemption_signals();
    std::raise(SIGINT);
    if (preemption_requested()) ::_exit(10);
    std::raise(SIGTERM);
    std::raise(SIGINT);
    ::_exit(preemption_signal() == SIGTERM ? 0 : 11);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("preemption: a repeated SIGTERM is the same request, not a stop at once") {
  const int status = in_child([] {
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    catch_preemption_signals();
    std::raise(SIGTERM);
    std::raise(SIGTERM);  // mpirun passing on what the scheduler sent it
    std::raise(SIGTERM);
    ::_exit(preemption_signal() == SIGTERM ? 0 : 10);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("preemption: a SIGINT after the first signal goes to the handlers installed before") {
  static volatile sig_atomic_t earlier = 0;
  const int status = in_child([] {
    struct sigaction a {};
    a.sa_handler = [](int sig) { earlier = earlier * 100 + sig; };
    sigemptyset(&a.sa_mask);
    ::sigaction(SIGTERM, &a, nullptr);
    ::sigaction(SIGINT, &a, nullptr);
    catch_preemption_signals();
    std::raise(SIGTERM);
    if (earlier != 0 || !preemption_requested()) ::_exit(10);
    std::raise(SIGINT);  // to the earlier handler, which is back for SIGTERM as well
    std::raise(SIGTERM);
    ::_exit(earlier == SIGINT * 100 + SIGTERM ? 0 : 11);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace test_preemption
