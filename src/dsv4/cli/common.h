// What the model-loading commands share: opening the engine (or the demo model), the
// tokenizer next to it, sampling defaults, and the one-line stats report.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsv4/cli/commands.h"
#include "dsv4/experts/planner.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::cli {

kernels::Numerics parse_numerics(const std::string& s);

// Token ids separated by whitespace and/or commas; `what` names the source in errors.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& what);

// The checkpoint directory to use: the flag, or the built-in demo model (models/demo of the
// source tree, a tiny DeepSeek V4 trained on the King James Bible; DSV4_DEMO_DIR overrides).
std::string resolve_model_dir(const ModelOptions& m);

// Opens the engine under the --ram budget planned for `workload`.
std::unique_ptr<Engine> open_engine(const ModelOptions& m, const WorkloadShape& workload);

struct LoadedModel {
  std::string dir;
  std::unique_ptr<Engine> engine;
  text::Tokenizer tokenizer;
  bool demo = false;
};
// Tokenizer first (cheap, and a missing tokenizer.json fails before the weights load).
LoadedModel load_model(const ModelOptions& m, const WorkloadShape& workload);

// The workload of interactive use: the --ctx limit, else a default conversation length.
WorkloadShape interactive_workload(const ModelOptions& m);

SamplingParams sampling_params(const std::string& model_dir, const SamplingOptions& s);

// "prompt 20 tok (12 reused) | TTFT 0.31 s | prefill 45.2 tok/s | decode 3.1 tok/s | experts hit 81% | read 1.2 GB | peak RSS 9.8 GB"
std::string stats_line(const GenerationStats& s);

}  // namespace dsv4::cli
