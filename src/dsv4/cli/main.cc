// dsv4 command line. The only translation unit that includes CLI11 (it is slow to compile).
// Every flag comes from the settings table (src/dsv4/runtime/settings.cc), which also names
// the DSV4_* environment variable that supplies its default.
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <set>

#include <CLI/CLI.hpp>

#include "dsv4/bench/bench.h"
#include "dsv4/cli/commands.h"
#include "dsv4/runtime/settings.h"
#include "dsv4/util/error.h"

extern char** environ;

namespace {

using dsv4::setting;

// Adds the registered setting `key` to `cmd`, bound to `target` (a flag when it is a bool).
template <typename T>
CLI::Option* add(CLI::App* cmd, const char* key, T& target) {
  const dsv4::Setting& s = setting(key);
  CLI::Option* opt;
  if constexpr (std::is_same_v<T, bool>)
    opt = cmd->add_flag(s.flag, target, s.help);
  else
    opt = cmd->add_option(s.flag, target, s.help);
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
  add(cmd, "ram", m.ram);
  add(cmd, "io", m.io)->check(CLI::IsMember({"auto", "uring", "threads"}));
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
  add(cmd, "system", c.system);
  add(cmd, "think", c.think);
  add(cmd, "effort", c.effort)->check(CLI::IsMember({"high", "max"}));
}

// CLI11 says "arguments were not expected" without a hint; find the unknown flag and suggest.
std::string suggest_flag(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> known;
  std::function<void(CLI::App*)> collect = [&](CLI::App* cmd) {  // nested too (bench kernels)
    for (CLI::App* sub : cmd->get_subcommands([](CLI::App*) { return true; })) {
      for (const CLI::Option* opt : sub->get_options())
        for (const std::string& name : opt->get_lnames()) known.push_back("--" + name);
      collect(sub);
    }
  };
  collect(&app);
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
  app.name("dsv4");
  app.require_subcommand(1);

  dsv4::cli::RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "answer one prompt, streaming the text (chat-encoded unless --raw)");
  add_model_options(run_cmd, run.model, false);
  add_sampling_options(run_cmd, run.sampling);
  add_chat_style(run_cmd, run.style);
  add(run_cmd, "prompt", run.prompt);
  add(run_cmd, "raw", run.raw);
  add(run_cmd, "run_json", run.json);

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
  add(inspect_cmd, "inspect_dir", inspect.dir)->required();
  add(inspect_cmd, "inspect_json", inspect.json);

  dsv4::cli::ScoreOptions score;
  auto* score_cmd = app.add_subcommand("score", "teacher-forced logits of a token sequence");
  add_model_options(score_cmd, score.model, true);
  add(score_cmd, "tokens_file", score.tokens_file)->required();
  add(score_cmd, "logits_out", score.logits_out)->required();

  dsv4::cli::GenerateOptions gen;
  auto* gen_cmd = app.add_subcommand("generate", "greedy continuation of a token sequence");
  add_model_options(gen_cmd, gen.model, true);
  add(gen_cmd, "tokens", gen.tokens)->required();
  add(gen_cmd, "generate_n", gen.n)->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  add(gen_cmd, "greedy", gen.greedy);
  add(gen_cmd, "print_ids", gen.print_ids);

  dsv4::cli::TokenizeOptions tokenize;
  auto* tokenize_cmd = app.add_subcommand("tokenize", "encode stdin to token ids, or decode ids to text");
  add(tokenize_cmd, "tokenizer", tokenize.tokenizer)->required();
  add(tokenize_cmd, "jsonl", tokenize.jsonl);
  add(tokenize_cmd, "decode", tokenize.decode);

  auto* settings_cmd = app.add_subcommand("settings", "list every flag and DSV4_* environment variable");

  std::vector<std::string> env_problems = dsv4::unknown_environment(environ);
  if (!env_problems.empty()) {
    for (const std::string& p : env_problems) std::fprintf(stderr, "dsv4: error: %s\n", p.c_str());
    return 2;
  }


  // dsv4 synth: synthetic checkpoints in the official format (real geometry by default).
  dsv4::cli::SynthCliOptions synth;
  auto* synth_cmd = app.add_subcommand("synth", "write a synthetic checkpoint (random weights, official format)");
  {
    dsv4::SynthOptions& s = synth.options;
    add(synth_cmd, "synth_out", s.out)->required();
    add(synth_cmd, "synth_demo", synth.demo);
    add(synth_cmd, "synth_layers", s.layers)->check(CLI::Range(1, 1024));
    add(synth_cmd, "synth_experts", s.experts)->check(CLI::Range(1, 4096));
    add(synth_cmd, "synth_experts_per_token", s.experts_per_token)->check(CLI::Range(1, 4096));
    add(synth_cmd, "synth_hidden", s.hidden)->check(CLI::Range(64, 65536));
    add(synth_cmd, "synth_moe_inter", s.moe_inter)->check(CLI::Range(64, 65536));
    add(synth_cmd, "synth_heads", s.heads)->check(CLI::Range(1, 1024));
    add(synth_cmd, "synth_head_dim", s.head_dim)->check(CLI::Range(4, 4096));
    add(synth_cmd, "synth_rope_dim", s.rope_dim)->check(CLI::Range(2, 4096));
    add(synth_cmd, "synth_q_lora", s.q_lora)->check(CLI::Range(1, 65536));
    add(synth_cmd, "synth_o_groups", s.o_groups)->check(CLI::Range(1, 1024));
    add(synth_cmd, "synth_o_lora", s.o_lora)->check(CLI::Range(1, 65536));
    add(synth_cmd, "synth_index_heads", s.index_heads)->check(CLI::Range(1, 1024));
    add(synth_cmd, "synth_index_head_dim", s.index_head_dim)->check(CLI::Range(2, 4096));
    add(synth_cmd, "synth_index_topk", s.index_topk)->check(CLI::Range(1, 1 << 20));
    add(synth_cmd, "synth_vocab", s.vocab)->check(CLI::Range(16, 16'000'000));
    add(synth_cmd, "synth_hash_layers", s.hash_layers)->check(CLI::Range(0, 1024));
    add(synth_cmd, "synth_mtp", s.mtp_layers)->check(CLI::Range(0, 16));
    add(synth_cmd, "synth_shard_size", s.shard_bytes)->check(CLI::Range(uint64_t{1} << 20, uint64_t{1} << 40));
    add(synth_cmd, "synth_seed", s.seed);
    add(synth_cmd, "synth_quiet", synth.quiet);
  }

  // dsv4 bench -m DIR: the model under a RAM budget; dsv4 bench kernels: the matmul kernels.
  dsv4::cli::BenchModelOptions bench;
  auto* bench_cmd = app.add_subcommand("bench", "benchmarks: -m DIR (the model under a RAM budget) or 'kernels'");
  bench_cmd->require_subcommand(0, 1);
  {
    add_model_options(bench_cmd, bench.model, false);
    add(bench_cmd, "bench_prompt_tokens", bench.prompt_tokens)->check(CLI::Range(1, 1 << 24));
    add(bench_cmd, "bench_gen_tokens", bench.gen_tokens)->check(CLI::Range(1, 1 << 24));
    add(bench_cmd, "bench_seed", bench.seed);
    add(bench_cmd, "bench_prompt_file", bench.prompt_file);
    add(bench_cmd, "bench_ssd_probe_bytes", bench.probe_bytes)->check(CLI::Range(uint64_t{4} << 20, uint64_t{1} << 40));
    add(bench_cmd, "bench_lookahead", bench.lookahead)->check(CLI::IsMember({"off", "exact", "all"}));
    add(bench_cmd, "bench_json", bench.json);
    add(bench_cmd, "bench_replay", bench.replay);
    add(bench_cmd, "bench_trace_out", bench.trace_out);
    add(bench_cmd, "bench_trace_in", bench.trace_in);
  }
  dsv4::cli::BenchKernelsOptions bench_kernels;
  auto* bench_kernels_cmd =
      bench_cmd->add_subcommand("kernels", "matmul kernels at V4 Flash shapes vs. the machine's measured limits");
  add(bench_kernels_cmd, "kernels_n", bench_kernels.n);
  add(bench_kernels_cmd, "kernels_format", bench_kernels.format);
  add(bench_kernels_cmd, "kernels_mode", bench_kernels.mode);
  add(bench_kernels_cmd, "threads", bench_kernels.threads)->check(CLI::Range(0, 1024));
  add(bench_kernels_cmd, "kernels_seconds", bench_kernels.seconds);
  add(bench_kernels_cmd, "kernels_json", bench_kernels.json);

  if (argc < 2) {  // no command: show what there is
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    std::fprintf(stderr, "dsv4: error: %s%s\n", e.what(), suggest_flag(app, argc, argv).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // One line, like every other error (CLI11 would add "Run with --help ...").
    std::fprintf(stderr, "dsv4: error: %s (see --help)\n", e.what());
    return 2;
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
    if (*synth_cmd) return dsv4::cli::synth(synth);
    if (*bench_kernels_cmd) return dsv4::cli::bench_kernels(bench_kernels);
    if (*bench_cmd) {
      if (bench.model.dir.empty()) throw dsv4::Error("bench: -m DIR is required (or: dsv4 bench kernels)");
      return dsv4::cli::bench_model(bench);
    }
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
