# Runs COMMAND (a ;-list) and passes only when it exits non-zero with output matching EXPECT and
# without signs of a crash. Used for the "bad input gets one clear error" tests of the programs.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 120)
set(all "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0; output:\n${all}")
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the program did not exit normally (${rc}); output:\n${all}")
endif()
if(all MATCHES "terminate called|Segmentation|Aborted|core dumped")
  message(FATAL_ERROR "the program crashed; output:\n${all}")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}':\n${all}")
endif()
message(STATUS "failed as expected (exit ${rc}): ${all}")
