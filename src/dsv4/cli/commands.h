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
  bool json = false;
};
int inspect(const InspectOptions& o);

// dsv4 tokenize: text on stdin -> token ids (or ids -> text with decode). See tokenize.cc.
struct TokenizeOptions {
  std::string tokenizer;  // path of tokenizer.json
  bool jsonl = false;
  bool decode = false;
};
int tokenize(const TokenizeOptions& o);

// Options shared by every command that loads a model.
struct ModelOptions {
  std::string dir;                // empty: the built-in demo model (run, chat, serve)
  std::string numerics = "fast";  // reference | fast
  int threads = 0;
  int64_t chunk = 0;              // prefill chunk (0 = automatic)
  int64_t ctx = 0;                // context limit (0 = the model's)
  std::string ram;                // --ram: "" = default share of available memory, "min", "12G", ...
  std::string io = "auto";        // --io: auto | uring | threads (expert reads)
  bool quiet_stats = false;
};

struct ScoreOptions {
  ModelOptions model;
  std::string tokens_file;
  std::string logits_out;
};
int score(const ScoreOptions& o);

struct GenerateOptions {
  ModelOptions model;
  std::string tokens;  // "id,id,..."
  int64_t n = 16;
  bool greedy = true;
  bool print_ids = true;
};
int generate(const GenerateOptions& o);

// Sampling flags; unset ones come from the checkpoint's generation_config.json.
struct SamplingOptions {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  int64_t max_tokens = 512;
  std::vector<std::string> stop;
};

struct ChatStyle {
  std::string system;
  bool think = false;
  std::string effort;  // "", "high", "max"
};

struct RunOptions {
  ModelOptions model;
  SamplingOptions sampling;
  ChatStyle style;
  std::vector<std::string> prompt;  // joined with spaces
  bool raw = false;
  bool json = false;
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
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed)
  std::string api_key;
  int max_queue = 8;
  std::string model_name;  // empty: the checkpoint directory's name
  int cache_entries = 8;
  int64_t cache_mb = 1024;
  int64_t max_body_mb = 16;
};
int serve(const ServeOptions& o);

struct SynthCliOptions {
  SynthOptions options;
  bool demo = false;
  bool quiet = false;
};
int synth(const SynthCliOptions& o);

}  // namespace dsv4::cli
