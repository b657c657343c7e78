# Installs the built library into a scratch prefix, then configures, builds and runs the consumer
# project against it; then the same against the build tree itself (pipeline_DIR). Invoked by
# CTest with SOURCE_DIR, BINARY_DIR, WORK_DIR and GENERATOR.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()

function(build_and_run_consumer name find_option)
  set(build ${WORK_DIR}/${name})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${build}
                          -G ${GENERATOR} ${find_option}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring the consumer project (${name}, ${find_option}) failed (${rc})")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building the consumer project (${name}) failed (${rc})")
  endif()
  execute_process(COMMAND ${build}/consumer RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the consumer program (${name}) failed (${rc})")
  endif()
endfunction()

build_and_run_consumer(build -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
build_and_run_consumer(build-tree -Dpipeline_DIR=${BINARY_DIR})
