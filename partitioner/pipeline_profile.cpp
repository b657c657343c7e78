// pipeline-profile: measures every layer of a zoo model and writes profile.json
// (pipeline.profile/1), plus a readable table on stdout. Errors go to stderr with a non-zero exit;
// the profile is written through a temporary file and a rename, so a failure leaves no partial
// file.
#include <pipeline/core/error.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/ops/precision.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/profile/profiler.hpp>

#include "../examples/common/validators.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

void print_table(const pipeline::Profile& p, const pipeline::ZooModel& z, double seconds) {
  const auto shapes = z.model.shapes(z.input_shape(p.batch_size), z.model.all());

  fmt::print("model {} ({} layers), batch {}, {}, {}\n", p.model, p.size(), p.batch_size, p.dtype,
             p.device);
  fmt::print("{:>3}  {:<12} {:<14} {:<20} {:>9} {:>24} {:>15} {:>11} {:>11} {:>8}\n", "#", "layer",
             "kind", "output shape", "fwd ms", "bwd ms (input/weight)", "IQR fwd/bwd", "output",
             "params", "GFLOP/s");
  double fwd = 0, bwd = 0, flops = 0;
  std::int64_t params = 0;
  pipeline::StepTimes step;
  for (int i = 0; i < p.size(); ++i) {
    const auto& l = p.layers[static_cast<std::size_t>(i)];
    const std::string split = l.backward_input_s > 0 || l.backward_weight_s > 0
                                  ? fmt::format("{:.3f} ({:.3f}/{:.3f})", l.backward_s * 1e3,
                                                l.backward_input_s * 1e3, l.backward_weight_s * 1e3)
                                  : fmt::format("{:.3f}", l.backward_s * 1e3);
    fmt::print("{:>3}  {:<12} {:<14} {:<20} {:>9.3f} {:>24} {:>15} {:>11} {:>11} {:>8.2f}\n", i,
               l.name, l.kind, shapes[static_cast<std::size_t>(i) + 1].str(), l.forward_s * 1e3,
               split,
               fmt::format("{:.3f}/{:.3f}", l.forward_spread_s * 1e3, l.backward_spread_s * 1e3),
               human_bytes(static_cast<double>(l.output_bytes)),
               human_bytes(static_cast<double>(l.parameter_bytes)),
               l.forward_s > 0 ? l.flops / l.forward_s / 1e9 : 0.0);
    fwd += l.forward_s;
    bwd += l.backward_s;
    flops += l.flops;
    params += l.parameter_bytes;
    step += l.step_s;
  }
  fmt::print(
      "total: forward {:.3f} ms, backward {:.3f} ms, {} of parameters, {:.3f} GFLOP forward "
      "({:.2f} GFLOP/s)\n",
      fwd * 1e3, bwd * 1e3, human_bytes(static_cast<double>(params)), flops / 1e9,
      fwd > 0 ? flops / fwd / 1e9 : 0.0);
  fmt::print(
      "optimizer step over every layer: sgd {:.3f} ms, momentum {:.3f} ms, adamw {:.3f} ms\n",
      step.sgd * 1e3, step.momentum * 1e3, step.adamw * 1e3);
  fmt::print(
      "times are medians over the repeats, IQR their interquartile range (ms); GFLOP/s is forward "
      "FLOPs over forward time; profiled in {:.1f} s\n",
      seconds);
}

// A profile taken while other processes keep the cores busy comes out slow, and so do the plans
// and predictions made from it: where, before profiling, the tasks running besides this one
// (the least of a few looks at /proc/loadavg's runnable count, so that a blip does not count)
// and the profile's threads are more than the cores, say so on stderr. Silent where unknown.
void note_busy_machine(int threads) {
  // More threads than the CPUs this process may run on wait for each other at every parallel
  // region (mlp at 64 threads on 2 cores: 13x slower a pass), whatever else runs.
  if (const int cpus = pipeline::allowed_cpus(); threads > cpus) {
    fmt::print(stderr,
               "pipeline-profile: warning: --threads {} is more than the {} CPUs this process "
               "may run on: its threads wait for each other at every parallel region, so its "
               "times (and the plans made from them) come out slow; profile with at most {} "
               "threads, the number each rank will compute on\n",
               threads, cpus, cpus);
    return;
  }
  int others = std::numeric_limits<int>::max();
  for (int look = 0; look < 5; ++look) {
    if (look > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream in("/proc/loadavg");
    double one = 0, five = 0, fifteen = 0;
    int running = 0;
    char slash = 0;
    if (!(in >> one >> five >> fifteen >> running >> slash) || slash != '/') return;
    others = std::min(others, running - 1);  // this process is one of them
  }
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cores <= 0 || others <= 0 || others + threads <= cores) return;
  fmt::print(stderr,
             "pipeline-profile: note: {} other task(s) are running on the {} cores, so they "
             "compete with the profile's {} thread(s): its times (and the plans made from them) "
             "may come out slow; profile on an idle machine, or with fewer --threads\n",
             others, cores, threads);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measure every layer of a zoo model and write profile.json for pipeline-partition"};
  std::string model_name, device_text = "cpu", output, dtype = "float32";
  int batch = 64, threads = 0;
  bool quiet = false, no_split = false;
  pipeline::ProfileOptions opt;
  pipeline::ZooOptions zoo;
  app.add_option("--model", model_name,
                 "zoo model: mlp, fashion-cnn, vgg16, resnet18, transformer-lm")
      ->required();
  app.add_option("--batch", batch, "minibatch size to profile (default 64)");
  app.add_option("--device", device_text,
                 "cpu (default), cuda or cuda:N (CUDA builds: CUDA-event timing on the GPU)");
  app.add_option("--dtype", dtype,
                 "dtype of the matrix products, convolutions and attention: float32 (default) or "
                 "bf16 (mixed precision; the profile says \"dtype\": \"bfloat16\" and the "
                 "bytes of weight versions stashed in bf16)")
      ->check(CLI::IsMember({"float32", "bf16"}));
  app.add_option("--warmup", opt.warmup, "untimed runs per measurement (default 2)");
  app.add_option("--repeat", opt.repeat,
                 "timed runs per measurement; medians over these (default 10)");
  app.add_option("--threads", threads, "CPU threads (default: the machine's cores)");
  app.add_option("--seed", opt.seed, "seed of parameters and inputs")
      ->check(pipeline::examples::non_negative_number());
  app.add_flag("--no-split", no_split, "skip the separate input- and weight-gradient measurements");
  app.add_option("--layers-per-pass", opt.layers_per_pass,
                 "profile the layers this many at a time, each group in passes of its own (a "
                 "model too large for the device at once); 0: all together (default)")
      ->check(pipeline::examples::non_negative_number());
  app.add_option("-o,--output", output, "write profile.json here")
      ->required()
      ->check(pipeline::examples::file_to_write());
  app.add_flag("-q,--quiet", quiet, "no table on stdout");
  // (0 would mean the model's default inside ZooOptions: given, it is a mistake to name.)
  auto* images = app.add_option_group("image models (mlp, fashion-cnn, vgg16, resnet18)");
  images->add_option("--image-size", zoo.image_size, "input height and width (default 28 or 32)")
      ->check(pipeline::examples::positive_number());
  images->add_option("--channels", zoo.channels, "input channels (default 1 or 3)")
      ->check(pipeline::examples::positive_number());
  images->add_option("--classes", zoo.num_classes, "output classes (default 10)")
      ->check(pipeline::examples::positive_number());
  images->add_option("--width", zoo.width, "channel/hidden width multiplier (default 1)")
      ->check(pipeline::examples::positive_number());
  auto* text = app.add_option_group("transformer-lm");
  text->add_option("--seq-len", zoo.seq_len, "tokens per sample (default 64)")
      ->check(pipeline::examples::positive_number());
  text->add_option("--dim", zoo.dim, "model width (default 128)")
      ->check(pipeline::examples::positive_number());
  text->add_option("--heads", zoo.heads, "attention heads (default 4)")
      ->check(pipeline::examples::positive_number());
  text->add_option("--blocks", zoo.blocks, "transformer blocks (default 4)")
      ->check(pipeline::examples::positive_number());
  text->add_option("--vocab", zoo.vocab, "vocabulary size (default 256)")
      ->check(pipeline::examples::positive_number());
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t0 = std::chrono::steady_clock::now();
    const pipeline::Device device = pipeline::parse_device(device_text);
    PIPELINE_CHECK_AS(ConfigError, batch >= 1, "--batch must be at least 1, got {}", batch);
    PIPELINE_CHECK_AS(ConfigError, opt.repeat >= 1, "--repeat must be at least 1, got {}",
                      opt.repeat);
    PIPELINE_CHECK_AS(ConfigError, opt.warmup >= 0, "--warmup must be >= 0, got {}", opt.warmup);
    PIPELINE_CHECK_AS(ConfigError, app.count("--threads") == 0 || threads >= 1,
                      "--threads must be at least 1, got {}", threads);
    // A model's options of another kind of model would be silently ignored: name them.
    const bool lm = model_name == "transformer-lm";
    for (const auto* group : {images, text})
      if ((group == text) != lm)
        for (const CLI::Option* option : group->get_options())
          PIPELINE_CHECK_AS(ConfigError, option->count() == 0,
                            "{} is an option of {}, not of {}: leave it out", option->get_name(),
                            group == text ? "transformer-lm" : "the image models", model_name);
    opt.split_backward = !no_split;
    opt.compute_dtype = pipeline::ops::parse_compute_dtype(dtype);

    pipeline::ZooModel z = pipeline::make_model(model_name, zoo);
    pipeline::set_num_threads(threads > 0 ? threads : pipeline::default_num_threads());
    if (!device.is_cuda()) note_busy_machine(pipeline::num_threads());
    pipeline::Profile p = pipeline::profile(z, batch, device, opt);
    pipeline::write_profile(p, output);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!quiet) print_table(p, z, seconds);
  } catch (const pipeline::Error& e) {
    fmt::print(stderr, "pipeline-profile: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "pipeline-profile: unexpected error: {}\n", e.what());
    return 2;
  }
  return 0;
}
