# Tests of the example programs (label `example`): a short real training run, and bad input.
if(NOT TARGET train_fashion_mnist)
  return()
endif()

set(_train $<TARGET_FILE:train_fashion_mnist>)
add_test(NAME example.train_fashion_mnist.smoke
         COMMAND ${_train} --steps 30 --batch 32 --threads 1
                 --metrics ${CMAKE_CURRENT_BINARY_DIR}/smoke_metrics.jsonl)
set_tests_properties(example.train_fashion_mnist.smoke PROPERTIES LABELS example
                     PASS_REGULAR_EXPRESSION "test accuracy: [01]\\.[0-9][0-9][0-9][0-9]")

function(pipeline_expect_failure name expect)
  add_test(NAME example.bad_input.${name}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${ARGN}" "-DEXPECT=${expect}"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/support/expect_failure.cmake)
  set_tests_properties(example.bad_input.${name} PROPERTIES LABELS example)
endfunction()

pipeline_expect_failure(unknown_model "unknown model 'resnet-9000'" ${_train} --model resnet-9000)
pipeline_expect_failure(missing_data "dataset-fashion-mnist" ${_train} --data /nonexistent/fashion)
pipeline_expect_failure(zero_batch "--batch" ${_train} --batch 0)
pipeline_expect_failure(negative_lr "--lr" ${_train} --lr -1)
pipeline_expect_failure(not_safetensors "error: .*CMakeLists.txt" ${_train} --steps 1
                        --load ${CMAKE_CURRENT_SOURCE_DIR}/CMakeLists.txt)
pipeline_expect_failure(unwritable_metrics "cannot open metrics file" ${_train} --steps 1
                        --metrics /nonexistent/dir/metrics.jsonl)
pipeline_expect_failure(model_not_for_images "not Fashion-MNIST" ${_train} --model transformer-lm)
