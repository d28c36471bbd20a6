// Subcommand entry points. main.cc parses flags (the only file that includes CLI11) and
// calls one of these; each returns the process exit code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsv4/synth/synth.h"

namespace dsv4::cli {

struct InspectOptions {
  std::string dir;
  std::vector<std::string> mirrors;  // folders holding shards missing from `dir`
  bool json = false;
  bool deep = false;  // also read every tensor and check its values
};
int inspect(const InspectOptions& o);

// dsv4 tokenize: text on stdin -> token ids (or ids -> text with decode). See tokenize.cc.
struct TokenizeOptions {
  std::string tokenizer;  // path of tokenizer.json
  bool jsonl = false;
  bool decode = false;
  bool chat = false;  // stdin lines are chat completion requests: their prompts' ids
};
int tokenize(const TokenizeOptions& o);

// Options shared by every command that loads a model.
// Defaults, ranges and help are in the settings table (runtime/settings.cc); main.cc binds
// these fields to it by key, so nothing here repeats a default.
struct ModelOptions {
  std::string dir;       // -m; empty: the built-in demo model (run, chat, serve)
  std::string numerics;  // reference | fast
  int threads = 0;
  int64_t chunk = 0;     // prefill chunk (0 = automatic)
  int64_t admit_rows = 0;  // a prompt's rows per pass beside other sessions' rows
  int64_t ctx = 0;       // context limit (0 = the command's default)
  std::string ram;       // "auto", "min", "12G", ...
  std::string io;        // auto | uring | threads (expert reads)
  std::string cache_policy;  // lru | freq (cached expert evictions)
  std::string gpu;       // --gpu auto | off | N (src/dsv4/gpu/backend.h)
  uint64_t gpu_mem = 0;  // --gpu-mem bytes (0 = the device's)
  std::string demo_dir;  // DSV4_DEMO_DIR; empty: models/demo (next to the binary, else the source tree)
  std::vector<std::string> mirrors;  // --mirror DIR (repeatable): more copies of the shards
  std::string read_shares;           // --read-shares "2,1": expert reads per folder ("" = measured)
  std::string io_faults;             // DSV4_TEST_IO_FAULTS (test hook)
  bool quiet_stats = false;
};

struct ScoreOptions {
  ModelOptions model;
  std::string tokens_file;
  std::string logits_out;
  std::string mtp_logits_out;  // empty: none
};
int score(const ScoreOptions& o);

struct GenerateOptions {
  ModelOptions model;
  std::vector<int32_t> tokens;
  int64_t n = 0;
  bool greedy = true;
  bool print_ids = true;
};
int generate(const GenerateOptions& o);

// Sampling flags; unset ones come from the checkpoint's generation_config.json.
struct SamplingOptions {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  float frequency_penalty = 0, presence_penalty = 0;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  int64_t max_tokens = 0;
  std::vector<std::string> stop;
  std::string spec;  // speculative decoding mode
  int64_t draft_max = 0;
};

struct ChatStyle {
  std::string system;
  bool think = false;
  std::string effort;  // "" (none), "high", "max"
};

struct RunOptions {
  ModelOptions model;
  SamplingOptions sampling;
  ChatStyle style;
  std::vector<std::string> prompt;  // joined with spaces
  bool raw = false;
  bool special_tokens = false;  // --raw: specials in the prompt and the output are control tokens
  bool json = false;
  std::string json_schema;  // --json-schema FILE: constrain the answer to this schema
  bool schema_strict = true;  // --no-schema-strict: drop what cannot be enforced (warned on stderr)
  std::string batch;        // --batch PROMPTS.jsonl: many prompts through --parallel slots (run_batch.cc)
  std::string batch_out;    // --out RESULTS.jsonl
  int64_t batch_line_mb = 64;  // --batch-line-mb: the longest line read
  int parallel = 0;         // --parallel (0: from the RAM plan)
};
int run(const RunOptions& o);

struct ChatOptions {
  ModelOptions model;
  SamplingOptions sampling;
  ChatStyle style;
};
int chat(const ChatOptions& o);

// dsv4 serve: the OpenAI-compatible HTTP server and web chat page (src/dsv4/server/).
// Sampling flags set the defaults for requests that leave a field out.
struct ServeOptions {
  ModelOptions model;
  SamplingOptions sampling;
  std::string host;
  int port = 0;  // 0: any free port (printed)
  std::string api_key;
  int max_queue = 0;
  int parallel = 0;  // 0: from the RAM plan
  std::string model_name;  // empty: the checkpoint directory's name
  int cache_entries = 0;
  int64_t cache_mb = 0;
  int64_t cache_block = 0;
  int64_t max_body_mb = 0;
  int token_delay_ms = 0;  // DSV4_TEST_TOKEN_DELAY_MS (test hook)
  bool unsteered_constraints = false;  // DSV4_TEST_UNSTEERED_CONSTRAINTS (test hook)
  std::string cache_dir;   // the prefix cache's disk tier ("" = none)
  int64_t cache_dir_mb = 0;
  std::vector<std::string> model_aliases;
  bool strict_model = false;
};
int serve(const ServeOptions& o);

// Geometry flags of 0 (hash layers -1) keep the preset's value.
struct SynthCliOptions {
  SynthOptions options;
  std::string preset;  // flash | pro
  std::vector<int64_t> compress_ratios;  // --compress-ratios (empty: the preset's schedule)
  std::string layout;  // official | contiguous
  std::string routing_skew;  // off | real
  bool demo = false;
  bool quiet = false;
};
int synth(const SynthCliOptions& o);

// dsv4 relayout SRC DST: a copy of a checkpoint in the other byte layout (io/relayout.h).
struct RelayoutOptions {
  std::string src, dst;
  std::string layout;  // official | contiguous
  bool quiet = false;
};
int relayout(const RelayoutOptions& o);

}  // namespace dsv4::cli
