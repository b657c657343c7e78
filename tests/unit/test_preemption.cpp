// Stop signals: the first SIGTERM or SIGINT only sets the flag (the process keeps running and can
// checkpoint); a second one ends the process through the handler installed before, or the default
// action. Each case runs in a forked child, since the second signal kills it.
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

TEST_CASE("preemption: the first signal sets the flag, the second ends the process") {
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    const int status = in_child([sig] {
      // As in a fresh process: the handler before ours is the default action (not the test
      // runner's crash reporter, inherited from the parent, which is not async-signal-safe).
      std::signal(sig, SIG_DFL);
      catch_preemption_signals();
      catch_preemption_signals();  // idempotent
      if (preemption_requested() || preemption_signal() != 0) ::_exit(10);
      std::raise(sig);
      if (!preemption_requested() || preemption_signal() != sig) ::_exit(11);
      std::raise(sig);  // ends the process with the default action
      ::_exit(12);
    });
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == sig);
    if (WIFEXITED(status)) FAIL_CHECK("child exited with ", WEXITSTATUS(status));
  }
}

TEST_CASE("preemption: the second signal goes to the handler installed before") {
  static volatile sig_atomic_t earlier = 0;
  const int status = in_child([] {
    struct sigaction a {};
    a.sa_handler = [](int) { earlier = 1; };
    sigemptyset(&a.sa_mask);
    ::sigaction(SIGTERM, &a, nullptr);
    catch_preemption_signals();
    std::raise(SIGTERM);
    if (earlier != 0 || !preemption_requested()) ::_exit(10);
    std::raise(SIGTERM);
    ::_exit(earlier == 1 ? 0 : 11);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace test_preemption
