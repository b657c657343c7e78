# Runs COMMAND (a ;-list: an mpirun job in which rank DEAD of RANKS ends itself mid-training
# through PIPELINE_TEST_DIE_AT_STEP) and passes only when
#  - the job exits non-zero within LIMIT seconds (far below the run's --comm-timeout: the
#    survivors must not sit out the timeout, let alone hang),
#  - the dying rank announced itself (so the fault was really injected),
#  - every surviving rank wrote its line saying that it was ended and where it was,
#  - at least one survivor names the dead rank as the peer it waited for,
#  - and nothing crashed.
foreach(v COMMAND RANKS DEAD LIMIT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "expect_peer_death.cmake: -D${v}=... is required")
  endif()
endforeach()

string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 600)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
set(all "${out}${err}")

if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0 after ${elapsed} s; output:\n${all}")
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself (${rc}) after ${elapsed} s; output:\n${all}")
endif()
if(elapsed GREATER LIMIT)
  message(FATAL_ERROR "the job took ${elapsed} s to end, more than ${LIMIT} s; output:\n${all}")
endif()
if(NOT all MATCHES "\\[rank ${DEAD}\\] PIPELINE_TEST_DIE_AT_STEP: rank ${DEAD} ends itself")
  message(FATAL_ERROR "rank ${DEAD} did not die by the injected fault; output:\n${all}")
endif()
if(all MATCHES "terminate called|Segmentation|core dumped")
  message(FATAL_ERROR "a rank crashed; output:\n${all}")
endif()

math(EXPR last "${RANKS} - 1")
set(named_dead FALSE)
foreach(r RANGE 0 ${last})
  if(r EQUAL DEAD)
    continue()
  endif()
  string(REGEX MATCH "\\[rank ${r}\\] error: host [^,\n]+, pid [0-9]+: mpirun ended this rank \\(SIGTERM\\) while it was [^\n]*find the rank that mpirun names[^\n]*"
         line "${all}")
  if(NOT line)
    message(FATAL_ERROR "surviving rank ${r} did not report its end; output:\n${all}")
  endif()
  if(NOT line MATCHES "while it was (waiting for|computing; its last wait was for) .*, at stage [0-9]+ replica [0-9]+, action [0-9]+ of [0-9]+")
    message(FATAL_ERROR "surviving rank ${r} does not say where it was in its schedule:\n${line}")
  endif()
  if(line MATCHES "(from|to) rank ${DEAD}[^0-9]")
    set(named_dead TRUE)
  endif()
endforeach()
if(NOT named_dead)
  message(FATAL_ERROR "no survivor names rank ${DEAD} as the peer it waited for; output:\n${all}")
endif()
message(STATUS "rank ${DEAD} died; the job ended with exit ${rc} after ${elapsed} s:\n${all}")
