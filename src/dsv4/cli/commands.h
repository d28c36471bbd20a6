// Subcommand entry points. main.cc parses flags (the only file that includes CLI11) and
// calls one of these; each returns the process exit code.
#pragma once

#include <string>

namespace dsv4::cli {

struct InspectOptions {
  std::string dir;
  bool json = false;
};
int inspect(const InspectOptions& o);

// ---- bench kernels (compute kernels) ----
struct BenchKernelsOptions {
  std::string n = "1,16,128,512";  // comma-separated batch sizes
  std::string format;              // comma-separated: fp4,fp8,bf16 (empty = all)
  std::string mode = "fast";       // fast | reference | both
  int threads = 0;                 // 0 = all available CPUs
  double seconds = 0.5;            // minimum timed time per case (at least 5 repetitions)
  bool json = false;
};
int bench_kernels(const BenchKernelsOptions& o);

}  // namespace dsv4::cli
