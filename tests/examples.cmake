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
# Refused before training, not after it (an epoch of no batch divided by zero; a missing
# directory for --save failed once the parameters were trained).
pipeline_expect_failure(batch_over_dataset "use a batch size of at most 60000" ${_train}
                        --batch 60001 --steps 1)
pipeline_expect_failure(checkpoint_every_without_dir "--checkpoint-every and --checkpoint-keep need a directory"
                        ${_train} --model mlp --steps 1 --checkpoint-every 1)
pipeline_expect_failure(save_to_missing_dir "--save: cannot write .*does not exist" ${_train}
                        --steps 1 --save /nonexistent/dir/params.safetensors)

# Pipelined runs under mpirun (one rank per stage replica) and their bad input: every rank ends
# with the error, never a hang.
set(_mpirun ${MPIEXEC_EXECUTABLE} ${PIPELINE_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG})
set(_plans ${CMAKE_CURRENT_SOURCE_DIR}/data/runtime)
# A flag the chosen schedule has no use for is refused, not ignored.
pipeline_expect_failure(vertical_sync_without_stash "--vertical-sync chooses the weight version of each microbatch under 1f1b-stash; 1f1b-flush keeps one version"
                        ${_train} --model mlp --in-process --plan ${_plans}/mlp_2.json
                        --schedule 1f1b-flush --vertical-sync --steps 1 --threads 1)
add_test(NAME example.train_fashion_mnist.pipeline_1f1b_stash
         COMMAND ${_mpirun} 2 ${_train} --model mlp --plan ${_plans}/mlp_2.json
                 --schedule 1f1b-stash --steps 40 --batch 32 --threads 1 --eval-batch 2000
                 --trace ${CMAKE_CURRENT_BINARY_DIR}/pipeline_trace.json)
add_test(NAME example.train_fashion_mnist.pipeline_replicated_flush
         COMMAND ${_mpirun} 3 ${_train} --model mlp --plan ${_plans}/mlp_3_replicated.json
                 --schedule 1f1b-flush --microbatches 4 --steps 20 --batch 32 --threads 1
                 --eval-batch 2000)
add_test(NAME example.train_fashion_mnist.pipeline_auto_plan
         COMMAND ${_mpirun} 2 ${_train} --model mlp --schedule gpipe --steps 20 --batch 32
                 --threads 1 --eval-batch 2000)
add_test(NAME example.train_fashion_mnist.pipeline_2bw
         COMMAND ${_mpirun} 2 ${_train} --model mlp --plan ${_plans}/mlp_2.json --schedule 2bw
                 --microbatches 4 --steps 40 --batch 32 --threads 1 --eval-batch 2000)
# A single-process run names the pipeline flags it was given and ignores (they were read only
# from a hand-kept list, which had lost --comm, --profile, --recompute and --rebalance-every).
add_test(NAME example.train_fashion_mnist.pipeline_flags_ignored
         COMMAND ${_train} --model mlp --steps 2 --batch 32 --threads 1 --eval-batch 10000
                 --comm mpi --microbatches 2 --recompute all --rebalance-every 5)
set_tests_properties(example.train_fashion_mnist.pipeline_flags_ignored PROPERTIES LABELS example
                     PASS_REGULAR_EXPRESSION "ignoring --comm, --microbatches, --recompute, --rebalance-every: this run trains in one process(.|\n)*test accuracy: 0\\.[0-9]+")
# Steps that the replicas cannot all take (2-1 takes minibatches in pairs): the run says so,
# trains the pairs it can and evaluates what it trained (it reported an accuracy of 0).
add_test(NAME example.train_fashion_mnist.pipeline_steps_not_dealt
         COMMAND ${_mpirun} 3 ${_train} --model mlp --plan ${_plans}/mlp_3_replicated.json
                 --steps 5 --batch 32 --threads 1 --eval-batch 2000)
set_tests_properties(example.train_fashion_mnist.pipeline_steps_not_dealt PROPERTIES
                     LABELS example PROCESSORS 2 TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "training 4 of the 5 steps asked for(.|\n)*epoch 1: test loss [0-9.]+ test accuracy 0\.[0-9]*[1-9]")
set_tests_properties(example.train_fashion_mnist.pipeline_1f1b_stash
                     example.train_fashion_mnist.pipeline_2bw
                     example.train_fashion_mnist.pipeline_replicated_flush
                     example.train_fashion_mnist.pipeline_auto_plan
                     PROPERTIES LABELS example PROCESSORS 2 TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "test accuracy: [01]\\.[0-9][0-9][0-9][0-9]")

pipeline_expect_failure(plan_wrong_world "plan is for 2 workers but the job has 3 ranks"
                        ${_mpirun} 3 ${_train} --model mlp --plan ${_plans}/mlp_2.json --steps 2)
pipeline_expect_failure(plan_wrong_model "plan is for model 'mlp' but the program trains 'fashion-cnn'"
                        ${_mpirun} 2 ${_train} --model fashion-cnn --plan ${_plans}/mlp_2.json --steps 2)
pipeline_expect_failure(schedule_deadlock "deadlock|wait on each other|never"
                        ${_mpirun} 2 ${_train} --model mlp --plan ${_plans}/mlp_2.json --steps 2
                        --schedule-csv ${_plans}/deadlock_2.csv)
# A CSV schedule fixes its own microbatches: a --microbatches beside it would be ignored.
pipeline_expect_failure(schedule_csv_with_microbatches "--schedule-csv excludes --microbatches"
                        ${_train} --model mlp --plan ${_plans}/mlp_2.json --in-process --steps 2
                        --schedule-csv ${_plans}/deadlock_2.csv --microbatches 4)
pipeline_expect_failure(2bw_too_few_microbatches "needs at least 3 microbatches"
                        ${_mpirun} 4 ${_train} --model mlp --plan ${_plans}/mlp_4.json --steps 2
                        --schedule 2bw --microbatches 2)
pipeline_expect_failure(stash_with_microbatches "microbatches"
                        ${_mpirun} 2 ${_train} --model mlp --plan ${_plans}/mlp_2.json --steps 2
                        --schedule 1f1b-stash --microbatches 4)

# Activation recomputation as a user reaches it: pipeline-partition under a memory cap that only
# recomputation meets (--recompute none fails naming the fix, auto recomputes), then the trainer
# on that plan, its measured peak per rank under the cap.
if(TARGET pipeline-profile AND TARGET pipeline-partition)
  add_test(NAME example.recompute_under_memory_cap
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/recompute_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-partition> ${_train} ${_mpirun})
  set_tests_properties(example.recompute_under_memory_cap PROPERTIES LABELS "example;mpi" PROCESSORS 2
                       TIMEOUT 300)

  # bf16 mixed precision as a user reaches it: a bf16 profile, its plan, --dtype bf16 training
  # under 1f1b-stash beside float32 (weight versions stashed in fewer bytes, the planner's estimate
  # held), and transformer-lm's loss in bf16 within 2% of float32 after 200 steps.
  set(_bf16_lm "-")
  if(TARGET train_transformer_lm AND EXISTS /usr/share/games/fortunes/fortunes)
    set(_bf16_lm $<TARGET_FILE:train_transformer_lm>)
  endif()
  add_test(NAME example.bf16_mixed_precision
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/bf16_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-partition> ${_train}
                   ${_bf16_lm} ${_mpirun})
  set_tests_properties(example.bf16_mixed_precision PROPERTIES LABELS "example;mpi" PROCESSORS 2
                       TIMEOUT 300)
endif()

# The planner's memory estimate against the allocator's peak on 2 ranks of a transformer-lm plan
# (the profile's per-layer working memory charged once per stage) and of a fashion-cnn plan, and
# pipeline-simulate's for that plan under GPipe and ZB-H1.
if(TARGET pipeline-profile AND TARGET pipeline-partition AND TARGET pipeline-simulate
   AND TARGET train_transformer_lm AND EXISTS /usr/share/games/fortunes/fortunes)
  add_test(NAME example.memory_model
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/memory_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-partition>
                   $<TARGET_FILE:pipeline-simulate> $<TARGET_FILE:train_transformer_lm> ${_train}
                   ${_mpirun})
  set_tests_properties(example.memory_model PROPERTIES LABELS "example;mpi" PROCESSORS 2
                       TIMEOUT 300)
endif()

# An interleaved plan as a user reaches it: pipeline-partition --virtual-stages 2, its timeline
# from pipeline-simulate --schedule interleaved, and the trainer on 2 ranks under the plan's
# interleaved-1f1b, whose losses equal one process's.
if(TARGET pipeline-profile AND TARGET pipeline-partition AND TARGET pipeline-simulate)
  add_test(NAME example.interleaved_plan
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/interleaved_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-partition>
                   $<TARGET_FILE:pipeline-simulate> ${_train} ${_mpirun})
  set_tests_properties(example.interleaved_plan PROPERTIES LABELS "example;mpi" PROCESSORS 2
                       TIMEOUT 300)
  add_test(NAME example.flush_plan
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/flush_plan_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-partition>
                   $<TARGET_FILE:pipeline-simulate> ${_train} ${_mpirun})
  set_tests_properties(example.flush_plan PROPERTIES LABELS "example;mpi" PROCESSORS 2 TIMEOUT 300)
endif()

# Uneven replication (1-2-3 on 6 ranks): flush equals one process, stash learns.
add_test(NAME example.uneven_replicas
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/uneven_replicas.sh ${_train}
                 ${_plans}/mlp_6_uneven.json ${_mpirun})
set_tests_properties(example.uneven_replicas PROPERTIES LABELS "example;mpi" PROCESSORS 2 TIMEOUT 300)

# In-process pipelines (--in-process: every rank a thread of one process) equal the same plans
# under mpirun bit for bit, and their bad input ends the run with the error, never a hang.
if(TARGET train_transformer_lm AND EXISTS /usr/share/games/fortunes/fortunes)
  set(_lm $<TARGET_FILE:train_transformer_lm>)
else()
  set(_lm -)
endif()
add_test(NAME example.in_process
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/in_process_scenario.sh ${_train} ${_lm}
                 ${_plans} ${_mpirun})
set_tests_properties(example.in_process PROPERTIES LABELS "example;mpi" PROCESSORS 2 TIMEOUT 300)
# A plan records the options of the model it was profiled as: one made for --dim 32 is refused for a
# --dim 64 model (same layers; the partition and memory estimate are another model's).
if(NOT _lm STREQUAL "-")
  pipeline_expect_failure(plan_of_another_architecture
                          "plan was made for transformer-lm with --dim 32 but this run builds it with --dim 64: train with --dim 32"
                          ${_lm} --in-process --plan ${_plans}/transformer_lm_dim32_2.json --dim 64
                          --blocks 1 --seq-len 16 --steps 1 --threads 1)
  pipeline_expect_failure(profile_of_another_architecture
                          "--profile .* is of transformer-lm with --dim 64 but --plan was made for it with --dim 32"
                          ${_lm} --in-process --plan ${_plans}/transformer_lm_dim32_2.json --dim 32
                          --blocks 1 --seq-len 16 --steps 1 --threads 1
                          --profile ${_plans}/transformer_lm_dim64_profile.json)
  if(TARGET pipeline-simulate)
    pipeline_expect_failure(simulate_profile_of_another_architecture
                            "the plan was made for transformer-lm with --dim 32 but the profile is of it with --dim 64"
                            $<TARGET_FILE:pipeline-simulate> --plan ${_plans}/transformer_lm_dim32_2.json
                            --profile ${_plans}/transformer_lm_dim64_profile.json)
  endif()
  # Model options the command line leaves out are the plan's (its model among them): the run builds
  # the model it was made for, and says so.
  add_test(NAME example.train_transformer_lm.plan_model_options
           COMMAND ${_lm} --in-process --plan ${_plans}/transformer_lm_dim32_2.json --steps 1
                   --threads 1 --batch 8)
  set_tests_properties(example.train_transformer_lm.plan_model_options PROPERTIES LABELS example
                       PASS_REGULAR_EXPRESSION "--plan: --blocks 1 --dim 32 --heads 4 --seq-len 16, as the plan was made")
  # ... and the batch it was profiled at: microbatches of another size are trained, with a warning
  # that the plan's times and memory are not theirs.
  add_test(NAME example.train_transformer_lm.plan_of_another_batch
           COMMAND ${_lm} --in-process --plan ${_plans}/transformer_lm_dim32_2.json --dim 32
                   --blocks 1 --seq-len 16 --steps 1 --threads 1 --batch 16)
  set_tests_properties(example.train_transformer_lm.plan_of_another_batch PROPERTIES LABELS example
                       PASS_REGULAR_EXPRESSION "plan was made from a profile at batch 8, but this run's microbatches hold 16 samples")
  # ... and the optimizer whose state its memory estimate charges (pipeline-partition's default,
  # momentum: one copy of the weights; this trainer's AdamW holds two).
  add_test(NAME example.train_transformer_lm.plan_of_another_optimizer
           COMMAND ${_lm} --in-process --plan ${_plans}/transformer_lm_dim32_2.json --dim 32
                   --blocks 1 --seq-len 16 --steps 1 --threads 1 --batch 8)
  set_tests_properties(example.train_transformer_lm.plan_of_another_optimizer PROPERTIES
                       LABELS example
                       PASS_REGULAR_EXPRESSION "memory estimate is for the momentum optimizer \\(1 weight copy per stage\\) but this run trains with adamw \\(2 weight copies\\): its stages hold more than planned; for a plan of this run, partition with --optimizer adamw")
  # Replicas take minibatches in groups: --steps 3 on two replicas trains 2 and says so, 1 is refused.
  add_test(NAME example.train_transformer_lm.steps_not_dealt
           COMMAND ${_lm} --in-process --plan ${_plans}/transformer_lm_dim32_data_parallel.json
                   --dim 32 --blocks 1 --seq-len 16 --steps 3 --threads 1 --batch 8)
  set_tests_properties(example.train_transformer_lm.steps_not_dealt PROPERTIES LABELS example
                       PASS_REGULAR_EXPRESSION "training 2 of the 3 steps asked for")
  pipeline_expect_failure(lm_steps_below_replicas "train at least 2 steps"
                          ${_lm} --in-process --plan ${_plans}/transformer_lm_dim32_data_parallel.json
                          --dim 32 --blocks 1 --seq-len 16 --steps 1 --threads 1 --batch 8)
endif()
pipeline_expect_failure(in_process_without_plan "--in-process runs the stages of a plan"
                        ${_train} --in-process --steps 1)
pipeline_expect_failure(profile_without_plan "--profile names the profile --plan was made from"
                        ${_train} --in-process --steps 1
                        --profile ${PROJECT_SOURCE_DIR}/fuzz/corpus/profile_json/chain.json)
pipeline_expect_failure(profile_of_another_model
                        "--profile .*chain.json is of chain6 .6 layers. but --plan is for mlp"
                        ${_train} --in-process --model mlp --plan ${_plans}/mlp_2.json --steps 1
                        --profile ${PROJECT_SOURCE_DIR}/fuzz/corpus/profile_json/chain.json)
pipeline_expect_failure(in_process_plan_wrong_model
                        "rank [0-9]. the plan is for model 'mlp' but the program trains 'fashion-cnn'"
                        ${_train} --model fashion-cnn --in-process --plan ${_plans}/mlp_2.json --steps 2)
pipeline_expect_failure(nccl_on_cpu "--comm nccl moves tensors between GPUs"
                        ${_mpirun} 2 ${_train} --model mlp --plan ${_plans}/mlp_2.json --steps 2
                        --comm nccl)
if(NOT PIPELINE_WITH_CUDA)
  pipeline_expect_failure(cuda_pipeline_without_cuda "sees no CUDA device"
                          ${_mpirun} 2 ${_train} --model mlp --plan ${_plans}/mlp_2.json
                          --steps 2 --device cuda)
  pipeline_expect_failure(cuda_in_process_without_cuda "sees no CUDA device"
                          ${_train} --model mlp --plan ${_plans}/mlp_2.json --steps 2
                          --device cuda --in-process)
endif()
pipeline_expect_failure(in_process_under_mpirun "--in-process runs the whole plan in one process"
                        ${_mpirun} 2 ${_train} --in-process --model mlp --plan ${_plans}/mlp_2.json
                        --steps 2)

# GPU pipelines as a user runs them (CUDA builds; skipped without a GPU): staged MPI and
# in-process on one GPU equal each other and one GPU process.
if(PIPELINE_WITH_CUDA)
  set(_gpu_data /usr/share/datasets/fashion-mnist)
  if(EXISTS ${PROJECT_SOURCE_DIR}/.device/fashion-mnist)
    set(_gpu_data ${PROJECT_SOURCE_DIR}/.device/fashion-mnist)  # the GPU machine (DEVICE.md)
  endif()
  add_test(NAME gpu.pipeline_scenario
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/gpu_pipeline_scenario.sh ${_train}
                   ${_plans} ${_gpu_data} ${_mpirun})
  set_tests_properties(gpu.pipeline_scenario PROPERTIES LABELS "gpu;mpi" PROCESSORS 2 TIMEOUT 300
                       SKIP_RETURN_CODE 77)
endif()

# Checkpoints, resume (same plan bit-identical, a bf16 run resumed in bf16 without --dtype,
# 1f1b-stash, another plan, an interleaved plan, after SIGKILL, after an interrupted write) and
# SIGTERM to mpirun or to the whole job, driven as a user drives them
# (support/checkpoint_scenarios.sh).
foreach(_case bitwise-sequential bitwise-sequential-bf16 bitwise-gpipe bitwise-1f1b-flush stash replan sigkill
        interrupted refused finished replicated sigterm sigterm-stash sigterm-rank1 sigterm-all interleaved
        sigterm-interleaved schedule-csv)
  add_test(NAME example.checkpoint.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/checkpoint_scenarios.sh ${_case} ${_train}
                   ${_plans} ${_mpirun})
  # Most of these runs start processes and load data, one core's worth on average: two such
  # scenarios share the machine (the twelve took 66 s one at a time, 52 two at a time on 2 cores).
  # Those that signal a running job keep it to themselves: mpirun's 3 s grace must cover a step
  # and a checkpoint.
  set(_cores 1)
  if(_case MATCHES "^sig")
    set(_cores 2)
  endif()
  set_tests_properties(example.checkpoint.${_case} PROPERTIES LABELS "example;mpi"
                       PROCESSORS ${_cores} TIMEOUT 300)
endforeach()
if(TARGET train_transformer_lm AND EXISTS /usr/share/games/fortunes/fortunes)
  set_tests_properties(example.checkpoint.refused PROPERTIES
                       ENVIRONMENT "TRAIN_TRANSFORMER_LM=$<TARGET_FILE:train_transformer_lm>")
endif()

if(TARGET train_transformer_lm AND EXISTS /usr/share/games/fortunes/fortunes)
  add_test(NAME example.train_transformer_lm.smoke
           COMMAND $<TARGET_FILE:train_transformer_lm> --steps 30 --threads 1)
  add_test(NAME example.train_transformer_lm.pipeline
           COMMAND ${_mpirun} 2 $<TARGET_FILE:train_transformer_lm> --steps 30 --threads 1
                   --schedule 1f1b-flush --microbatches 2)
  # A run shorter than the default schedule's 20 warm-up steps warms up for half of it.
  add_test(NAME example.train_transformer_lm.short_run
           COMMAND $<TARGET_FILE:train_transformer_lm> --steps 3 --threads 1)
  set_tests_properties(example.train_transformer_lm.short_run PROPERTIES LABELS example
                       PASS_REGULAR_EXPRESSION "validation loss: ")
  set_tests_properties(example.train_transformer_lm.smoke example.train_transformer_lm.pipeline
                       PROPERTIES LABELS example PROCESSORS 2 TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "validation loss: [0-9.]+ perplexity: [0-9.]+")
endif()

# A rank that dies mid-training (the fault-injection hook PIPELINE_TEST_DIE_AT_STEP of
# examples/common/fault_injection.hpp): the job must fail well within --comm-timeout, with a line
# from every survivor saying where it was. mpirun ends the survivors with SIGTERM as soon as it
# sees the death; LIMIT (seconds, start-up included) is a fraction of the 120 s timeout. mpirun
# follows its SIGTERM with a SIGKILL after odls_base_sigkill_timeout seconds (default 1), which
# on a loaded machine can come before a descheduled survivor has run its handler and written its
# line. 3 s: each such test takes about 2 s longer (mpirun waits out the grace).
function(pipeline_expect_peer_death name ranks dead how)
  add_test(NAME example.peer_death.${name}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${ARGN}" -DRANKS=${ranks} -DDEAD=${dead} -DLIMIT=40
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/support/expect_peer_death.cmake)
  set_tests_properties(example.peer_death.${name} PROPERTIES
                       LABELS "example;mpi" PROCESSORS 2 TIMEOUT 300)
  set_property(TEST example.peer_death.${name} PROPERTY ENVIRONMENT
               "PIPELINE_TEST_DIE_AT_STEP=${dead}:5${how}" "OMPI_MCA_odls_base_sigkill_timeout=3")
endfunction()
foreach(n 2 4)
  math(EXPR _dead "${n} / 2")
  set(_job ${_mpirun} ${n} ${_train} --model mlp --plan ${_plans}/mlp_${n}.json
           --schedule 1f1b-stash --steps 3000 --batch 32 --threads 1 --comm-timeout 120)
  pipeline_expect_peer_death(exit_np${n} ${n} ${_dead} "" ${_job})
  pipeline_expect_peer_death(sigkill_np${n} ${n} ${_dead} ":kill" ${_job})
endforeach()

# Several hosts made on this machine (support/netns_hosts.sh: network namespaces on a bridge, 100
# Mbit/s out of each): pipeline-partition's rankfile places the ranks, a 2-stage pipeline trains
# across the hosts at the simulator's predicted throughput (-20%..+15%), and a 4-stage one on
# 2 hosts x 2 ranks equals the same plan on one host. Needs root and iproute2 (skipped otherwise);
# serial, as its throughput check wants the cores to itself.
if(TARGET pipeline-profile AND TARGET pipeline-partition AND TARGET pipeline-simulate)
  add_test(NAME example.multihost_netns
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/multihost_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-partition>
                   $<TARGET_FILE:pipeline-simulate> ${_train} ${MPIEXEC_EXECUTABLE} ${PIPELINE_MPIRUN_FLAGS})
  set_tests_properties(example.multihost_netns PROPERTIES LABELS "example;mpi;multihost" PROCESSORS 2
                       RUN_SERIAL TRUE TIMEOUT 300 SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "test accuracy: [01]\\.[0-9][0-9][0-9][0-9]")
endif()

# Fewer hosts than the plan needs is refused, naming how many it needs (no rankfile is written).
if(TARGET pipeline-partition)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/one_host.txt "node-a slots=4\n")
  pipeline_expect_failure(too_few_hosts "the plan needs 2 hosts .4 ranks, 2 per host at host level 1. but the hostfile lists 1"
                          $<TARGET_FILE:pipeline-partition> --profile ${CMAKE_CURRENT_SOURCE_DIR}/data/partition/chain.json
                          --level 2:10Gbit/s --level 2:1Gbit/s --hosts ${CMAKE_CURRENT_BINARY_DIR}/one_host.txt
                          --rankfile ${CMAKE_CURRENT_BINARY_DIR}/too_few_hosts_rankfile.txt)
endif()

# On a typed topology the rankfile puts each stage's ranks on hosts of its device type (the
# hostfile lists the 4 h100 hosts, then the 8 a100 ones): the plan's a100 stage comes first.
if(TARGET pipeline-partition)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/typed_hosts.txt
       "h1\nh2\nh3\nh4\na1\na2\na3\na4\na5\na6\na7\na8\n")
  add_test(NAME unit.partition_cli.typed_rankfile
           COMMAND $<TARGET_FILE:pipeline-partition>
                   --profile h100=${CMAKE_CURRENT_SOURCE_DIR}/data/partition/chain_fast.json
                   --profile a100=${CMAKE_CURRENT_SOURCE_DIR}/data/partition/chain.json
                   --topology ${CMAKE_CURRENT_SOURCE_DIR}/data/partition/mixed_h100_a100.json
                   --hosts ${CMAKE_CURRENT_BINARY_DIR}/typed_hosts.txt
                   --rankfile ${CMAKE_CURRENT_BINARY_DIR}/typed_rankfile.txt)
  set_tests_properties(unit.partition_cli.typed_rankfile PROPERTIES LABELS unit
                       PASS_REGULAR_EXPRESSION "rank 0 on a1, rank 1 on a2,[^\n]* rank 8 on h1, rank 9 on h2")
endif()

# A straggler among replicas (PIPELINE_TEST_SLOW_RANK of examples/common/fault_injection.hpp): one
# replica of a 2-replica stage slowed 3x lowers the measured throughput as `pipeline-simulate
# --slow-rank 1:3` predicts on this machine's profile, within 25%. Serial: it times the run.
if(TARGET pipeline-profile AND TARGET pipeline-simulate)
  add_test(NAME example.slow_rank
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/slow_rank_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-simulate> ${_train}
                   ${_plans}/mlp_2_data_parallel.json 3 ${_mpirun})
  set_tests_properties(example.slow_rank PROPERTIES LABELS "example;mpi" PROCESSORS 2 RUN_SERIAL TRUE
                       TIMEOUT 300)
  # The same straggler with --rebalance: its microbatches re-dealt to its peer by measured speed
  # recover throughput (1f1b-flush; >= 1.3x round-robin, predicted 2x) as `pipeline-simulate
  # --rebalance` predicts, within 25%.
  add_test(NAME example.rebalance
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/rebalance_scenario.sh
                   $<TARGET_FILE:pipeline-profile> $<TARGET_FILE:pipeline-simulate> ${_train}
                   ${_plans}/mlp_2_data_parallel.json 3 ${_mpirun})
  set_tests_properties(example.rebalance PROPERTIES LABELS "example;mpi" PROCESSORS 2 RUN_SERIAL TRUE
                       TIMEOUT 300)
endif()
pipeline_expect_failure(rebalance_needs_flush "--rebalance .*only flush schedules.*--schedule 1f1b-flush"
                        ${_mpirun} 2 ${_train} --model mlp
                        --plan ${_plans}/mlp_2_data_parallel.json --steps 2 --schedule 1f1b-stash
                        --rebalance)

# pipeline-simulate --availability: a trace with a worker lost and more gained, replayed against
# the static plan; a bad row is refused naming its line.
if(TARGET pipeline-simulate)
  set(_avail_dir ${CMAKE_CURRENT_SOURCE_DIR}/data/availability)
  add_test(NAME example.availability_trace
           COMMAND $<TARGET_FILE:pipeline-simulate> --profile ${CMAKE_CURRENT_SOURCE_DIR}/data/partition/chain.json
                   --availability ${_avail_dir}/day.csv --samples 2e8 --level 8:10Gbit/s
                   --restart-cost 5m --price 2.5)
  set_tests_properties(example.availability_trace PROPERTIES LABELS example
                       PASS_REGULAR_EXPRESSION "elastic: .*restart.*\nstatic on [0-9]+ workers")
  pipeline_expect_failure(availability_bad_row "bad_row.csv line 3: workers 'many'"
                          $<TARGET_FILE:pipeline-simulate> --profile ${CMAKE_CURRENT_SOURCE_DIR}/data/partition/chain.json
                          --availability ${_avail_dir}/bad_row.csv --samples 1e6 --level 4:10Gbit/s)
endif()

# pipeline-simulate --slow-rank and --jitter on the partitioner's plan, as the README shows them.
if(TARGET pipeline-simulate AND TARGET pipeline-partition)
  add_test(NAME example.simulate_stragglers
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/support/simulate_stragglers.sh
                   $<TARGET_FILE:pipeline-partition> $<TARGET_FILE:pipeline-simulate>
                   ${CMAKE_CURRENT_SOURCE_DIR}/data/partition/chain.json)
  set_tests_properties(example.simulate_stragglers PROPERTIES LABELS example
                       PASS_REGULAR_EXPRESSION "^samples/s: .*\nok")
endif()
