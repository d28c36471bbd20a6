// Subcommand entry points. main.cc parses flags (the only file that includes CLI11) and
// calls one of these; each returns the process exit code.
#pragma once

#include <string>
#include <vector>

#include "dsv4/experts/expert_trace.h"
#include "dsv4/tools/synth.h"

namespace dsv4::cli {

struct InspectOptions {
  std::string dir;
  bool json = false;
};
int inspect(const InspectOptions& o);

}  // namespace dsv4::cli

namespace dsv4::cli {

// Options shared by every command that loads a model.
struct ModelOptions {
  std::string dir;
  std::string numerics = "fast";  // reference | fast
  int threads = 0;
  std::string ram;  // --ram: "" = default share of available memory, "min", "12G", ...
  std::string io = "auto";  // --io: auto | uring | threads (expert reads)
  bool quiet_stats = false;
};

struct ScoreOptions {
  ModelOptions model;
  std::string tokens_file;
  std::string logits_out;
  int64_t chunk = 0;
};
int score(const ScoreOptions& o);

struct GenerateOptions {
  ModelOptions model;
  std::string tokens;  // "id,id,..."
  int64_t n = 16;
  bool greedy = true;
  bool print_ids = true;
  int64_t chunk = 0;
};
int generate(const GenerateOptions& o);

}  // namespace dsv4::cli

namespace dsv4::cli {

struct SynthCliOptions {
  SynthOptions options;
  bool demo = false;
  bool quiet = false;
};
int synth(const SynthCliOptions& o);

}  // namespace dsv4::cli

namespace dsv4::cli {

// dsv4 bench -m DIR (the model benchmark; `dsv4 bench kernels` is the kernel one).
struct BenchModelOptions {
  ModelOptions model;
  int64_t prompt_tokens = 64;
  int64_t gen_tokens = 16;
  int64_t chunk = 0;
  uint64_t seed = 1;
  uint64_t probe_bytes = 2ull << 30;  // bytes of shard read to measure the SSD
  std::string lookahead = "exact";  // off | exact (hash layers) | all
  bool json = false;
  // --replay: replay the recorded expert requests against a fresh store with a synthetic
  // compute model (per-layer dense, per-expert, head seconds) scaled by each factor.
  bool replay = false;
  ComputeModel replay_compute{0.0094, 0.0009, 0.030};
  std::vector<double> replay_scales{0, 0.5, 1, 2, 4};
  std::string trace_out;  // save the recorded expert requests
  std::string trace_in;   // replay these instead of running the model
};
int bench_model(const BenchModelOptions& o);

}  // namespace dsv4::cli
