// dsv4 command line. The only translation unit that includes CLI11 (it is slow to compile).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "dsv4/cli/commands.h"
#include "dsv4/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv4: DeepSeek V4 Flash on an ordinary CPU machine"};
  app.require_subcommand(1);

  dsv4::cli::InspectOptions inspect;
  auto* inspect_cmd = app.add_subcommand("inspect", "validate a checkpoint directory and describe it");
  inspect_cmd->add_option("dir", inspect.dir, "checkpoint directory")->required();
  inspect_cmd->add_flag("--json", inspect.json, "print JSON");

  // ---- bench (kernels block). `bench kernels` is a sub-subcommand so that `bench` itself
  // can take its own options later (e.g. `dsv4 bench -m DIR ...` for the model).
  dsv4::cli::BenchKernelsOptions bench_kernels;
  auto* bench_cmd = app.add_subcommand("bench", "measure speed");
  bench_cmd->require_subcommand(0, 1);
  auto* bench_kernels_cmd =
      bench_cmd->add_subcommand("kernels", "matmul kernels at V4 Flash shapes vs. the machine's measured limits");
  bench_kernels_cmd->add_option("--n", bench_kernels.n, "batch sizes, comma-separated")->capture_default_str();
  bench_kernels_cmd->add_option("--format", bench_kernels.format, "weight formats, comma-separated (fp4,fp8,bf16)");
  bench_kernels_cmd->add_option("--mode", bench_kernels.mode, "numerics: fast, reference or both")
      ->capture_default_str();
  bench_kernels_cmd->add_option("--threads", bench_kernels.threads, "threads (0 = all CPUs)");
  bench_kernels_cmd->add_option("--seconds", bench_kernels.seconds, "minimum timed seconds per case")
      ->capture_default_str();
  bench_kernels_cmd->add_flag("--json", bench_kernels.json, "print JSON");
  // ---- end bench (kernels block)

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*inspect_cmd) return dsv4::cli::inspect(inspect);
    if (*bench_kernels_cmd) return dsv4::cli::bench_kernels(bench_kernels);  // bench (kernels block)
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
