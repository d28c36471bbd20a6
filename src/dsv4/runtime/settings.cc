#include "dsv4/runtime/settings.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "dsv4/util/error.h"

namespace dsv4 {

const std::vector<Setting>& all_settings() {
  static const std::vector<Setting> kSettings = {
      {"model", "-m,--model", "DSV4_MODEL", "path", "", "checkpoint directory (run/chat/serve default to the demo model)"},
      {"ram", "--ram", "DSV4_RAM", "size", "auto",
       "RAM budget: 512M, 24G, 1.5G, 'min' (smallest that works) or 'auto' (a safe share of available memory)"},
      {"io", "--io", "DSV4_IO", "string", "auto", "expert reads: auto (io_uring, else threads), uring or threads"},
      {"threads", "--threads", "DSV4_THREADS", "int", "0", "compute threads (0 = all CPUs)"},
      {"numerics", "--numerics", "DSV4_NUMERICS", "string", "fast",
       "reference (float32 activations) or fast (quantized activations)"},
      {"chunk", "--chunk", "DSV4_CHUNK", "int", "0", "prefill chunk size in tokens (0 = automatic)"},
      {"ctx", "--ctx", "DSV4_CTX", "int", "0", "context limit in tokens (0 = the model's maximum)"},
      {"temperature", "--temperature", "DSV4_TEMPERATURE", "float", "", "sampling temperature (0 = greedy); default from generation_config.json"},
      {"top_p", "--top-p", "DSV4_TOP_P", "float", "", "nucleus sampling mass; default from generation_config.json"},
      {"top_k", "--top-k", "DSV4_TOP_K", "int", "0", "keep the k most likely tokens (0 = off)"},
      {"min_p", "--min-p", "DSV4_MIN_P", "float", "0", "drop tokens less likely than min_p x the top probability"},
      {"repetition_penalty", "--repetition-penalty", "DSV4_REPETITION_PENALTY", "float", "1", "penalty for tokens already in the context (1 = off)"},
      {"seed", "--seed", "DSV4_SEED", "int", "", "random seed (default: random, printed in the stats)"},
      {"max_tokens", "--max-tokens", "DSV4_MAX_TOKENS", "int", "512", "stop after this many generated tokens"},
      {"stop", "--stop", "", "list", "", "stop when this text is generated (repeatable)"},
      {"host", "--host", "DSV4_HOST", "string", "127.0.0.1", "address the server binds to"},
      {"port", "--port", "DSV4_PORT", "int", "8080", "port the server listens on"},
      {"api_key", "--api-key", "DSV4_API_KEY", "string", "", "require this bearer token on API requests"},
      {"max_queue", "--max-queue", "DSV4_MAX_QUEUE", "int", "8", "requests allowed to wait for the engine before 429"},
      {"model_name", "--model-name", "DSV4_MODEL_NAME", "string", "", "serve: the model id clients send and /v1/models lists (default: the checkpoint directory's name)"},
      {"cache_entries", "--cache-entries", "DSV4_CACHE_ENTRIES", "int", "8", "serve: session snapshots the prefix cache keeps (0 = no prefix cache)"},
      {"cache_mb", "--cache-mb", "DSV4_CACHE_MB", "int", "1024", "serve: memory bound of the prefix cache in MiB"},
      {"max_body_mb", "--max-body-mb", "DSV4_MAX_BODY_MB", "int", "16", "serve: largest request body in MiB (larger: 413)"},
      // Command-specific flags (no environment variable).
      {"prompt", "prompt", "", "string", "stdin", "run: the prompt (positional; default: read stdin)"},
      {"raw", "--raw", "", "bool", "off", "run: plain text continuation, no chat encoding"},
      {"run_json", "--json", "", "bool", "off", "run: print one JSON object: text, prompt_tokens, tokens, finish_reason, stats"},
      {"system", "--system", "", "string", "", "run/chat: system prompt"},
      {"think", "--think,!--no-think", "", "bool", "off", "thinking mode: the model reasons before answering"},
      {"effort", "--effort", "", "string", "", "reasoning effort in thinking mode: high or max"},
      {"inspect_dir", "dir", "", "path", "", "inspect: checkpoint directory (positional)"},
      {"inspect_json", "--json", "", "bool", "off", "inspect: print JSON"},
      {"tokens_file", "--tokens-file", "", "path", "", "score: token ids separated by whitespace or commas"},
      {"logits_out", "--logits-out", "", "path", "", "score: output file, float32 little-endian [n_tokens, vocab]"},
      {"tokens", "--tokens", "", "list", "", "generate: prompt token ids, comma-separated"},
      {"generate_n", "-n", "", "int", "16", "generate: tokens to generate"},
      {"greedy", "--greedy", "", "bool", "on", "generate: argmax decoding (the only mode of this command)"},
      {"print_ids", "--print-ids", "", "bool", "on", "generate: print the generated ids comma-separated"},
      {"tokenizer", "-t,--tokenizer", "", "path", "", "tokenize: the tokenizer.json to use"},
      {"jsonl", "--jsonl", "", "bool", "off", "tokenize: one JSON string (with --decode: one JSON array of ids) per line"},
      {"decode", "--decode", "", "bool", "off", "tokenize: ids in, text out"},
      {"synth_out", "--out", "", "path", "", "synth: output directory"},
      {"synth_demo", "--demo", "", "bool", "off", "synth: the small deterministic demo model with a tokenizer (~90 MB)"},
      {"synth_layers", "--layers", "", "int", "4", "synth: main layers"},
      {"synth_experts", "--experts", "", "int", "256", "synth: routed experts per layer"},
      {"synth_experts_per_token", "--experts-per-token", "", "int", "6", "synth: routed experts per token (top-k)"},
      {"synth_hidden", "--hidden", "", "int", "4096", "synth: hidden size"},
      {"synth_moe_inter", "--moe-inter", "", "int", "2048", "synth: expert intermediate size"},
      {"synth_heads", "--heads", "", "int", "64", "synth: attention heads"},
      {"synth_head_dim", "--head-dim", "", "int", "512", "synth: attention head dim"},
      {"synth_rope_dim", "--rope-dim", "", "int", "64", "synth: rotary dims per head"},
      {"synth_q_lora", "--q-lora", "", "int", "1024", "synth: query low rank"},
      {"synth_o_groups", "--o-groups", "", "int", "8", "synth: output projection groups"},
      {"synth_o_lora", "--o-lora", "", "int", "1024", "synth: output projection rank"},
      {"synth_index_heads", "--index-heads", "", "int", "64", "synth: indexer heads"},
      {"synth_index_head_dim", "--index-head-dim", "", "int", "128", "synth: indexer head dim"},
      {"synth_index_topk", "--index-topk", "", "int", "512", "synth: indexer top-k"},
      {"synth_vocab", "--vocab", "", "int", "129280", "synth: vocabulary size"},
      {"synth_hash_layers", "--hash-layers", "", "int", "3 of 43, scaled", "synth: hash-routed layers"},
      {"synth_mtp", "--mtp", "", "int", "0", "synth: MTP layers (the real checkpoint has 1)"},
      {"synth_shard_size", "--shard-size", "", "size", "4294967296", "synth: bytes per shard (approximate)"},
      {"synth_seed", "--seed", "", "int", "1", "synth: random seed"},
      {"synth_quiet", "--quiet", "", "bool", "off", "synth: no progress on stderr"},
      {"bench_prompt_tokens", "--prompt-tokens", "", "int", "64", "bench: prompt length"},
      {"bench_gen_tokens", "--gen-tokens", "", "int", "16", "bench: tokens to decode"},
      {"bench_seed", "--seed", "", "int", "1", "bench: seed of the random prompt"},
      {"bench_prompt_file", "--prompt-file", "", "path", "", "bench: prompt token ids from this file (whitespace or commas) instead of the random prompt"},
      {"bench_ssd_probe_bytes", "--ssd-probe-bytes", "", "size", "2147483648", "bench: bytes of shard read to measure the SSD"},
      {"bench_lookahead", "--lookahead", "", "string", "all", "bench: guess experts ahead: off, exact (hash-routed layers only), all (also run routers early; the default)"},
      {"bench_json", "--json", "", "bool", "off", "bench: print one JSON object"},
      {"bench_replay", "--replay", "", "bool", "off", "bench: replay the recorded expert requests with a synthetic compute model at several speeds"},
      {"bench_trace_out", "--trace-out", "", "path", "", "bench: save the recorded expert requests to this file"},
      {"bench_trace_in", "--trace-in", "", "path", "", "bench: replay a saved trace instead of running the model"},
      {"kernels_n", "--n", "", "list", "1,16,128,512", "bench kernels: batch sizes, comma-separated"},
      {"kernels_format", "--format", "", "list", "fp4,fp8,bf16", "bench kernels: weight formats, comma-separated"},
      {"kernels_mode", "--mode", "", "string", "fast", "bench kernels: numerics: fast, reference or both"},
      {"kernels_seconds", "--seconds", "", "float", "0.5", "bench kernels: minimum timed seconds per case"},
      {"kernels_json", "--json", "", "bool", "off", "bench kernels: print JSON"},
      // Environment only.
      {"demo_dir", "", "DSV4_DEMO_DIR", "path", "~/.cache/dsv4/demo", "where the built-in demo model is created"},
      {"kernels", "", "DSV4_KERNELS", "string", "auto", "force a kernel path: scalar, avx2 or avx512"},
      {"test_token_delay_ms", "", "DSV4_TEST_TOKEN_DELAY_MS", "int", "0", "test hook: serve pauses this long after each token"},
      {"test_tmp", "", "DSV4_TEST_TMP", "path", "", "scratch directory for the test suite"},
      {"tok_oracle_seed", "", "DSV4_TOK_ORACLE_SEED", "int", "1", "test suite: seed of the tokenizer oracle's generated strings"},
      {"v3_tokenizer", "", "DSV4_V3_TOKENIZER", "path", "tests/node/node_modules/...", "tokenizer benchmark: the DeepSeek-V3 tokenizer.json to load"},
      {"fuzz_seconds", "", "DSV4_FUZZ_SECONDS", "int", "30", "scripts/test.sh: seconds per fuzz target"},
      {"skip_asan", "", "DSV4_SKIP_ASAN", "bool", "0", "scripts/test.sh: skip the sanitizer build"},
      {"setup_browser", "", "DSV4_SETUP_BROWSER", "bool", "1", "scripts/setup.sh: install Chromium for the web tests"},
  };
  return kSettings;
}

const Setting& setting(std::string_view key) {
  for (const Setting& s : all_settings())
    if (s.key == key) return s;
  fail("internal: no setting named {}", key);
}

namespace {
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the word's length, and at least 1 edit allowed.
  if (best_d > std::max<size_t>(2, word.size() / 3)) return "";
  return best;
}

std::vector<std::string> unknown_environment(char** environ) {
  std::vector<std::string> known;
  for (const Setting& s : all_settings())
    if (!s.env.empty()) known.push_back(s.env);
  std::vector<std::string> problems;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "DSV4_", 5) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string guess = closest_match(name, known);
    problems.push_back(guess.empty() ? fmt::format("unknown environment variable {}", name)
                                     : fmt::format("unknown environment variable {} (did you mean {}?)", name, guess));
  }
  return problems;
}

std::string env_value(std::string_view key) {
  const Setting& s = setting(key);
  if (s.env.empty()) return "";
  const char* v = std::getenv(s.env.c_str());
  return v ? v : "";
}

std::string describe_settings() {
  std::string out;
  for (const Setting& s : all_settings()) {
    std::string names = s.flag;
    if (!s.env.empty()) names += (names.empty() ? "" : " / ") + s.env;
    out += fmt::format("{:<42} {:<7} {:<20} {}\n", names, s.type, s.fallback.empty() ? "-" : s.fallback, s.help);
  }
  return out;
}

}  // namespace dsv4
