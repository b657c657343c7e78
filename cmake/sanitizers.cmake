# Run-time options for tests built with sanitizers (the asan and fuzz presets: unit tests, fuzzers;
# the tsan preset: the unit tests that run threads of their own).
#
# pipeline_sanitizer_environment(<var> [MPI]) sets <var> to the ENVIRONMENT entries a test needs
# when CMAKE_CXX_FLAGS enable AddressSanitizer, UBSan or ThreadSanitizer, and to nothing
# otherwise, so that ordinary builds run their tests unchanged;
# pipeline_apply_sanitizer_environment() adds them to the tests of a directory. The options make
# every finding fail the test (UBSan prints the stack and halts; -fno-sanitize-recover=undefined in
# the presets already makes it fatal) and point each sanitizer at its suppression file in
# tests/support/, where every entry says which third-party false positive it silences and why it
# is one.
function(pipeline_sanitizer_environment out_var)
  # MPI: LSan must unwind through OpenMPI's libraries, built without frame pointers, to see the
  # frames that lsan.supp names; the slow unwinder does, at a cost only MPI tests need to pay.
  cmake_parse_arguments(arg "MPI" "" "" ${ARGN})
  set(env)
  set(supp ${PROJECT_SOURCE_DIR}/tests/support)
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*address")
    set(asan "halt_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1")
    string(APPEND asan ":detect_stack_use_after_return=1:suppressions=${supp}/asan.supp")
    set(lsan "suppressions=${supp}/lsan.supp:print_suppressions=0")
    if(arg_MPI)
      string(APPEND asan ":fast_unwind_on_malloc=0")
    endif()
    list(APPEND env "ASAN_OPTIONS=${asan}" "LSAN_OPTIONS=${lsan}")
    # LLVM's OpenMP runtime (clang builds) leaks 1440 bytes of its own (___kmp_allocate in
    # __kmp_fork_call) each time a hot team is resized, as the tests do when they change the thread
    # count; without hot teams it allocates nothing it does not free. Turning them off changes
    # no result (GCC's libgomp ignores the variable), and needs no suppression that could hide a
    # leak of ours made inside a parallel region (whose stacks also hold libomp's frames).
    list(APPEND env "KMP_HOT_TEAMS_MAX_LEVEL=0")
  endif()
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*undefined")
    list(APPEND env
         "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=${supp}/ubsan.supp")
  endif()
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*thread")
    set(tsan "halt_on_error=1:second_deadlock_stack=1:suppressions=${supp}/tsan.supp")
    list(APPEND env "TSAN_OPTIONS=${tsan}" "OMP_TOOL_LIBRARIES=${PIPELINE_ARCHER_LIBRARY}")
  endif()
  set(${out_var} "${env}" PARENT_SCOPE)
endfunction()

# ThreadSanitizer does not see the synchronisation inside LLVM's OpenMP runtime (not instrumented):
# every parallel region would report races between its threads. Archer, an OpenMP tool shipped
# with that runtime, tells TSan about each region's fork, barriers and join; the tests load it
# through OMP_TOOL_LIBRARIES. Without it a TSan build's reports would be noise, so it is required.
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*thread")
  get_filename_component(_omp_dir "${OpenMP_omp_LIBRARY}" DIRECTORY)
  find_library(PIPELINE_ARCHER_LIBRARY archer HINTS ${_omp_dir})
  if(NOT PIPELINE_ARCHER_LIBRARY)
    message(FATAL_ERROR "ThreadSanitizer builds need LLVM's OpenMP tool libarcher.so beside "
                        "libomp (${_omp_dir}): install libomp-dev of the clang in use (Debian: "
                        "libomp-14-dev), or set PIPELINE_ARCHER_LIBRARY to its path")
  endif()
endif()

# Appends the sanitizer environment to every test defined so far in the calling directory (call
# it at the end of each CMakeLists.txt that adds tests); tests labelled `mpi` get the MPI variant.
function(pipeline_apply_sanitizer_environment)
  pipeline_sanitizer_environment(env)
  pipeline_sanitizer_environment(mpi_env MPI)
  if(NOT env)
    return()
  endif()
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    get_property(labels TEST ${t} PROPERTY LABELS)
    if("mpi" IN_LIST labels)
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${mpi_env})
    else()
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${env})
    endif()
  endforeach()
endfunction()
