// dsv4 command line. The only translation unit that includes CLI11 (it is slow to compile).
// Every flag comes from the settings table (src/dsv4/runtime/settings.cc), which also names
// the DSV4_* environment variable that supplies its default.
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>

#include <CLI/CLI.hpp>

#include "dsv4/cli/commands.h"
#include "dsv4/runtime/settings.h"
#include "dsv4/util/error.h"

extern char** environ;

namespace {

using dsv4::setting;

// Adds the registered setting `key` to `cmd`, bound to `target`.
template <typename T>
CLI::Option* add(CLI::App* cmd, const char* key, T& target) {
  const dsv4::Setting& s = setting(key);
  CLI::Option* opt = cmd->add_option(s.flag, target, s.help);
  if (!s.env.empty()) opt->envname(s.env);
  return opt;
}

void add_model_options(CLI::App* cmd, dsv4::cli::ModelOptions& m, bool model_required) {
  CLI::Option* model = add(cmd, "model", m.dir);
  if (model_required) model->required();
  add(cmd, "numerics", m.numerics)->check(CLI::IsMember({"reference", "fast"}));
  add(cmd, "threads", m.threads)->check(CLI::Range(0, 1024));
  add(cmd, "chunk", m.chunk)->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  add(cmd, "ctx", m.ctx)->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
}

void add_sampling_options(CLI::App* cmd, dsv4::cli::SamplingOptions& s) {
  add(cmd, "temperature", s.temperature);
  add(cmd, "top_p", s.top_p);
  add(cmd, "top_k", s.top_k)->check(CLI::Range(0, 1 << 30));
  add(cmd, "min_p", s.min_p);
  add(cmd, "repetition_penalty", s.repetition_penalty);
  add(cmd, "seed", s.seed);
  add(cmd, "max_tokens", s.max_tokens)->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  add(cmd, "stop", s.stop)->allow_extra_args(false);  // one string per --stop
}

void add_chat_style(CLI::App* cmd, dsv4::cli::ChatStyle& c) {
  cmd->add_option("--system", c.system, "system prompt");
  cmd->add_flag("--think,!--no-think", c.think, "thinking mode: the model reasons before answering (default: off)");
  cmd->add_option("--effort", c.effort, "reasoning effort in thinking mode: high or max")
      ->check(CLI::IsMember({"high", "max"}));
}

// CLI11 says "arguments were not expected" without a hint; find the unknown flag and suggest.
std::string suggest_flag(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> known;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    for (const CLI::Option* opt : sub->get_options())
      for (const std::string& name : opt->get_lnames()) known.push_back("--" + name);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) continue;
    arg = arg.substr(0, arg.find('='));
    if (std::find(known.begin(), known.end(), arg) != known.end()) continue;
    std::string guess = dsv4::closest_match(arg, known);
    if (!guess.empty()) return fmt::format(" (did you mean {}?)", guess);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsv4: DeepSeek V4 Flash on an ordinary CPU machine, from the official checkpoint"};
  app.require_subcommand(1);

  dsv4::cli::RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "answer one prompt, streaming the text (chat-encoded unless --raw)");
  add_model_options(run_cmd, run.model, false);
  add_sampling_options(run_cmd, run.sampling);
  add_chat_style(run_cmd, run.style);
  run_cmd->add_option("prompt", run.prompt, "the prompt (default: read stdin)");
  run_cmd->add_flag("--raw", run.raw, "plain text continuation, no chat encoding");
  run_cmd->add_flag("--json", run.json, "print one JSON object: text, prompt_tokens, tokens, finish_reason, stats");

  dsv4::cli::ChatOptions chat;
  auto* chat_cmd = app.add_subcommand("chat", "interactive multi-turn chat (reads lines from stdin when not a terminal)");
  add_model_options(chat_cmd, chat.model, false);
  add_sampling_options(chat_cmd, chat.sampling);
  add_chat_style(chat_cmd, chat.style);

  // dsv4 serve: sampling flags become the defaults of requests that leave a field out.
  dsv4::cli::ServeOptions serve;
  auto* serve_cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions) and a web chat page at /");
  add_model_options(serve_cmd, serve.model, false);
  add_sampling_options(serve_cmd, serve.sampling);
  add(serve_cmd, "host", serve.host);
  add(serve_cmd, "port", serve.port)->check(CLI::Range(0, 65535));
  add(serve_cmd, "api_key", serve.api_key);
  add(serve_cmd, "max_queue", serve.max_queue)->check(CLI::Range(0, 4096));
  add(serve_cmd, "model_name", serve.model_name);
  add(serve_cmd, "cache_entries", serve.cache_entries)->check(CLI::Range(0, 1024));
  add(serve_cmd, "cache_mb", serve.cache_mb)->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  add(serve_cmd, "max_body_mb", serve.max_body_mb)->check(CLI::Range(int64_t{1}, int64_t{4096}));

  dsv4::cli::InspectOptions inspect;
  auto* inspect_cmd = app.add_subcommand("inspect", "validate a checkpoint directory and describe it");
  inspect_cmd->add_option("dir", inspect.dir, "checkpoint directory")->required();
  inspect_cmd->add_flag("--json", inspect.json, "print JSON");

  dsv4::cli::ScoreOptions score;
  auto* score_cmd = app.add_subcommand("score", "teacher-forced logits of a token sequence");
  add_model_options(score_cmd, score.model, true);
  score_cmd->add_option("--tokens-file", score.tokens_file, "token ids separated by whitespace or commas")->required();
  score_cmd->add_option("--logits-out", score.logits_out, "output: float32 little-endian [n_tokens, vocab]")->required();

  dsv4::cli::GenerateOptions gen;
  auto* gen_cmd = app.add_subcommand("generate", "greedy continuation of a token sequence");
  add_model_options(gen_cmd, gen.model, true);
  gen_cmd->add_option("--tokens", gen.tokens, "prompt token ids, comma-separated")->required();
  gen_cmd->add_option("-n", gen.n, "tokens to generate")->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  gen_cmd->add_flag("--greedy", gen.greedy, "argmax decoding (the only mode of this command)");
  gen_cmd->add_flag("--print-ids", gen.print_ids, "print the generated ids comma-separated");

  dsv4::cli::TokenizeOptions tokenize;
  auto* tokenize_cmd = app.add_subcommand("tokenize", "encode stdin to token ids, or decode ids to text");
  tokenize_cmd->add_option("-t,--tokenizer", tokenize.tokenizer, "tokenizer.json")->required();
  tokenize_cmd->add_flag("--jsonl", tokenize.jsonl, "one JSON string (or, with --decode, one JSON array of ids) per line");
  tokenize_cmd->add_flag("--decode", tokenize.decode, "ids in, text out");

  auto* settings_cmd = app.add_subcommand("settings", "list every flag and DSV4_* environment variable");

  std::vector<std::string> env_problems = dsv4::unknown_environment(environ);
  if (!env_problems.empty()) {
    for (const std::string& p : env_problems) std::fprintf(stderr, "dsv4: error: %s\n", p.c_str());
    return 2;
  }

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
  add(bench_kernels_cmd, "threads", bench_kernels.threads)->check(CLI::Range(0, 1024));
  bench_kernels_cmd->add_option("--seconds", bench_kernels.seconds, "minimum timed seconds per case")
      ->capture_default_str();
  bench_kernels_cmd->add_flag("--json", bench_kernels.json, "print JSON");
  // ---- end bench (kernels block)

  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    std::fprintf(stderr, "dsv4: error: %s%s\n", e.what(), suggest_flag(app, argc, argv).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*run_cmd) return dsv4::cli::run(run);
    if (*chat_cmd) return dsv4::cli::chat(chat);
    if (*serve_cmd) return dsv4::cli::serve(serve);
    if (*inspect_cmd) return dsv4::cli::inspect(inspect);
    if (*score_cmd) return dsv4::cli::score(score);
    if (*gen_cmd) return dsv4::cli::generate(gen);
    if (*tokenize_cmd) return dsv4::cli::tokenize(tokenize);
    if (*settings_cmd) {
      std::fputs(dsv4::describe_settings().c_str(), stdout);
      return 0;
    }

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
