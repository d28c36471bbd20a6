// The benchmark commands (`dsv4 bench -m DIR`, `dsv4 bench kernels`): benchmark-only code
// lives in src/dsv4/bench/, a library of its own that only the dsv4 binary links.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/bench/expert_trace.h"
#include "dsv4/cli/commands.h"

namespace dsv4::cli {

// ---- bench kernels (compute kernels) ----
struct BenchKernelsOptions {
  std::vector<int64_t> n;            // batch sizes
  std::vector<std::string> formats;  // fp4, fp8, bf16
  std::string mode;                  // fast | reference | both
  int threads = 0;                   // 0 = all available CPUs
  double seconds = 0;                // minimum timed time per case (at least 5 repetitions)
  bool json = false;
};
int bench_kernels(const BenchKernelsOptions& o);

// ---- bench schemas (constrained decoding over the JSON Schema corpus) ----
struct BenchSchemasOptions {
  std::string corpus;     // folder of .jsonl files: {"name", "schema", "valid": [...], "invalid": [...]}
  std::string tokenizer;  // tokenizer.json of the vocabulary the masks cover
  bool json = false;
};
int bench_schemas(const BenchSchemasOptions& o);

// dsv4 bench -m DIR (the model benchmark; `dsv4 bench kernels` is the kernel one).
struct BenchModelOptions {
  ModelOptions model;
  int64_t prompt_tokens = 0;
  int64_t gen_tokens = 0;
  uint64_t seed = 0;
  std::string prompt_file;  // token ids; empty: a pseudo-random prompt of prompt_tokens
  uint64_t probe_bytes = 0;  // bytes of shard read to measure the SSD
  std::string lookahead;     // off | exact (hash layers) | all
  std::string spec;          // off | auto | ngram | oracle: a speculative run beside a plain one
  int64_t draft_max = 0;
  bool early_hash_reads = true;  // hash layers' experts read from the moment a token is sampled
  bool json = false;
  // --replay: replay the recorded expert requests against a fresh store with a synthetic
  // compute model (per-layer dense, per-expert, head seconds) scaled by each factor.
  bool replay = false;
  ComputeModel replay_compute{0.0094, 0.0009, 0.030};
  std::vector<double> replay_scales{0, 0.5, 1, 2, 4};
  std::string trace_out;  // save the recorded expert requests
  std::string trace_in;   // replay these instead of running the model
  // --soak MINUTES: then generate for that long (cycles of prompt + gen_tokens) and report
  // the decode speed and read rate over time.
  double soak_minutes = 0;  // 0: no soak
  // --sessions N[,N...]: concurrent streams sharing passes, against one stream in the same
  // run (bench_sessions.cc); --admit-prompt P: a P-token prompt admitted during their decode;
  // --rounds R: each count R times, interleaved (medians).
  std::vector<int64_t> sessions;
  int64_t admit_prompt = 0;
  int64_t rounds = 3;
};
int bench_model(const BenchModelOptions& o);
int bench_sessions(const BenchModelOptions& o);

}  // namespace dsv4::cli
