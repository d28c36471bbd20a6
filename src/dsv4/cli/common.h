// What the model-loading commands share: opening the engine (or the demo model), the
// tokenizer next to it, sampling defaults, and the one-line stats report.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/cli/commands.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::cli {

// The loader's options for these flags (numerics, threads, --ram, --io) and workload.
LoadOptions load_options(const ModelOptions& m, const WorkloadShape& workload);

// Token ids separated by whitespace and/or commas; `what` names the source in errors.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& what);

// The checkpoint directory to use: the flag, or the built-in demo model (models/demo of the
// source tree, a tiny DeepSeek V4 trained on the King James Bible; DSV4_DEMO_DIR overrides).
std::string resolve_model_dir(const ModelOptions& m);

// Opens the engine under the --ram budget planned for `workload` (the plan's line on stderr).
LoadedEngine open_engine(const ModelOptions& m, const WorkloadShape& workload);

struct LoadedModel {
  std::string dir;
  MemoryPlan plan;
  std::unique_ptr<Engine> engine;
  text::Tokenizer tokenizer;
  bool demo = false;
};
// Tokenizer first (cheap, and a missing tokenizer.json fails before the weights load).
LoadedModel load_model(const ModelOptions& m, const WorkloadShape& workload, MtpLoad mtp = MtpLoad::kNo);
// Whether --spec `spec` loads the MTP drafter: only mtp does.
MtpLoad mtp_load_for(const std::string& spec);

// The context of run, chat and serve when --ctx is 0: a long conversation, not the model's
// 1M-token maximum (the plan reserves session state for the whole context).
inline constexpr int64_t kInteractiveContextTokens = 16384;
// The prompt chunk of a server with several slots (and of bench --admit-prompt) when --chunk
// is not given: a pass carries every decoding slot's row and at most one such chunk, so a
// long prompt delays the others' next token by one chunk's compute at most.
inline constexpr int64_t kBatchedPromptChunk = 16;

// The workload of interactive use: the --ctx limit, else kInteractiveContextTokens.
WorkloadShape interactive_workload(const ModelOptions& m);

// "dsv4: stats: experts N requests, H% hits, ...; peak RSS X" (score, generate).
std::string expert_stats_line(const ExpertStats& s, uint64_t peak_rss);

SamplingParams sampling_params(const std::string& model_dir, const SamplingOptions& s);

// The context a generation gets: --ctx when given (and smaller), else the engine's.
int64_t context_tokens(const Engine& engine, const ModelOptions& m);

// The tokens of a prompt whose `plain` ranges are the caller's text, for a context of `limit`
// tokens: encoding stops at `limit` tokens, so an over-long prompt costs what the limit costs
// rather than what its text would, and is refused with one line that begins with `what`.
std::vector<int32_t> encode_prompt(const text::Tokenizer& tokenizer, std::string_view text,
                                   std::span<const text::TextRange> plain, int64_t limit, const std::string& what);

// "prompt 20 tok (12 reused) | TTFT 0.31 s | prefill 45.2 tok/s | decode 3.1 tok/s | experts hit 81% | read 1.2 GB | peak RSS 9.8 GB"
std::string stats_line(const GenerationStats& s);

}  // namespace dsv4::cli
