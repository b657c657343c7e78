// Preemption: SIGTERM or SIGINT — what a batch scheduler or a cloud sends before it takes the
// machines back — asks a run to finish its current step, write a checkpoint and exit.
//
// catch_preemption_signals() installs handlers for both. The first signal only sets a flag (and
// writes one line saying so); the training loop reads it between steps. A pipelined run must
// stop every rank after the same step: its ranks agree on that step while the pipeline keeps
// running (stop_agreement.hpp). A SIGINT after the first signal (Ctrl-C twice) ends the process at
// once, through the handler that was installed before (the "where was this rank" report of MPI
// programs) or the default action. A repeated SIGTERM is the same request, written and otherwise
// ignored: a scheduler signals every process of a job, mpirun passes on the SIGTERM it got, and a
// rank that died of the second would lose the checkpoint the first asked for.
//
// Under mpirun, a signal to mpirun reaches the ranks only after mpirun's grace period
// (`--mca odls_base_sigkill_timeout SECONDS`, 1 s by default) and SIGKILL follows one more period
// later: give the job a period longer than a step plus a checkpoint. Signals sent to the ranks
// themselves (as schedulers do to every process of a job) act at once.
#pragma once

namespace pipeline {

// Installs the SIGTERM and SIGINT handlers (again: no effect).
void catch_preemption_signals();

// Whether this process has received SIGTERM or SIGINT since the handlers were installed.
bool preemption_requested();

// The signal received (SIGTERM or SIGINT), 0 when none.
int preemption_signal();

// For tests: forgets a received signal.
void reset_preemption_request();

}  // namespace pipeline
