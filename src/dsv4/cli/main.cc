// dsv4 command line. The only translation unit that includes CLI11 (it is slow to compile).
// Every flag comes from the settings table (src/dsv4/runtime/settings.cc): this file binds
// option fields to it by key. The table gives each field its default, and one strict parser
// per kind turns what the user wrote — a flag, or the DSV4_* variable that stands in for it —
// into the field's value, so a bad value is one line naming the flag or variable.
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dsv4/bench/bench.h"
#include "dsv4/cli/commands.h"
#include "dsv4/platform/platform.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/gpu/backend.h"
#include "dsv4/runtime/settings.h"
#include "dsv4/util/error.h"


namespace {

using dsv4::Setting;
using dsv4::SettingKind;
using dsv4::SettingValue;
using dsv4::setting;

// Binds settings to fields. Environment variables are applied after parsing, and only for the
// command that runs and for flags the user did not give, so an error names the variable.
class Bindings {
 public:
  // Binds setting `key` to `target` on `cmd` (a flag when it has one; environment-only
  // settings just bind their variable). The field starts at the table's default.
  template <typename T>
  CLI::Option* add(CLI::App* cmd, const char* key, T& target) {
    const Setting& s = setting(key);
    dsv4::store_setting(s.fallback, target);
    auto store = [&target](const SettingValue& v) { dsv4::store_setting(v, target); };
    CLI::Option* opt = nullptr;
    if (!s.flag.empty()) {
      if constexpr (std::is_same_v<T, bool>) {
        opt = cmd->add_flag(s.flag, target, s.help);
      } else if (s.kind == SettingKind::kRepeated) {
        opt = cmd->add_option_function<std::vector<std::string>>(
            s.flag, [store](const std::vector<std::string>& v) { store(SettingValue(v)); }, s.help);
        opt->allow_extra_args(s.flag.rfind('-', 0) != 0);  // a positional takes every word; --stop one each
      } else {
        const std::string name = s.flag_name();
        opt = cmd->add_option_function<std::string>(
            s.flag, [store, &s, name](const std::string& v) { store(dsv4::parse_setting(s, v, name)); }, s.help);
      }
    }
    if (opt && s.kind != SettingKind::kBool) opt->type_name(dsv4::kind_name(s.kind));
    if (!s.env.empty()) env_.push_back({cmd, opt, &s, store});
    return opt;
  }

  void apply_environment() const {
    for (const EnvBinding& b : env_) {
      if (!*b.cmd || (b.opt && b.opt->count() > 0)) continue;
      const char* value = std::getenv(b.setting->env.c_str());
      if (!value) continue;
      b.store(dsv4::parse_setting(*b.setting, value, b.setting->env));
    }
  }

 private:
  struct EnvBinding {
    CLI::App* cmd;
    CLI::Option* opt;  // null: environment only
    const Setting* setting;
    std::function<void(const SettingValue&)> store;
  };
  std::vector<EnvBinding> env_;
};

void add_model_options(Bindings& b, CLI::App* cmd, dsv4::cli::ModelOptions& m, bool model_required) {
  CLI::Option* model = b.add(cmd, "model", m.dir);
  if (model_required) model->required();
  b.add(cmd, "numerics", m.numerics);
  b.add(cmd, "threads", m.threads);
  b.add(cmd, "chunk", m.chunk);
  b.add(cmd, "ctx", m.ctx);
  b.add(cmd, "admit_rows", m.admit_rows);
  b.add(cmd, "ram", m.ram);
  b.add(cmd, "io", m.io);
  b.add(cmd, "cache_policy", m.cache_policy);
  b.add(cmd, "gpu", m.gpu);
  b.add(cmd, "gpu_mem", m.gpu_mem);
  b.add(cmd, "mirror", m.mirrors);
  b.add(cmd, "read_shares", m.read_shares);
  b.add(cmd, "demo_dir", m.demo_dir);
  b.add(cmd, "test_io_faults", m.io_faults);
}

void add_sampling_options(Bindings& b, CLI::App* cmd, dsv4::cli::SamplingOptions& s) {
  b.add(cmd, "temperature", s.temperature);
  b.add(cmd, "top_p", s.top_p);
  b.add(cmd, "top_k", s.top_k);
  b.add(cmd, "min_p", s.min_p);
  b.add(cmd, "repetition_penalty", s.repetition_penalty);
  b.add(cmd, "frequency_penalty", s.frequency_penalty);
  b.add(cmd, "presence_penalty", s.presence_penalty);
  b.add(cmd, "seed", s.seed);
  b.add(cmd, "max_tokens", s.max_tokens);
  b.add(cmd, "stop", s.stop);
  b.add(cmd, "spec", s.spec);
  b.add(cmd, "draft_max", s.draft_max);
}

void add_chat_style(Bindings& b, CLI::App* cmd, dsv4::cli::ChatStyle& c) {
  b.add(cmd, "system", c.system);
  b.add(cmd, "think", c.think);
  b.add(cmd, "effort", c.effort);
}

// Every command's options, and what runs it.
struct Commands {
  dsv4::cli::RunOptions run;
  dsv4::cli::ChatOptions chat;
  dsv4::cli::ServeOptions serve;
  dsv4::cli::InspectOptions inspect;
  dsv4::cli::ScoreOptions score;
  dsv4::cli::GenerateOptions generate;
  dsv4::cli::TokenizeOptions tokenize;
  dsv4::cli::SynthCliOptions synth;
  dsv4::cli::RelayoutOptions relayout;
  dsv4::cli::BenchModelOptions bench;
  dsv4::cli::BenchKernelsOptions bench_kernels;
  dsv4::cli::BenchSchemasOptions bench_schemas;
  std::string kernels_path;  // DSV4_KERNELS

  struct Entry {
    CLI::App* app;
    std::function<int()> run;
  };
  std::vector<Entry> entries;  // nested commands before their parents
};

void register_run(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("run", "answer one prompt, streaming the text (chat-encoded unless --raw)");
  add_model_options(b, cmd, c.run.model, false);
  add_sampling_options(b, cmd, c.run.sampling);
  add_chat_style(b, cmd, c.run.style);
  b.add(cmd, "prompt", c.run.prompt);
  b.add(cmd, "raw", c.run.raw);
  b.add(cmd, "special_tokens", c.run.special_tokens);
  b.add(cmd, "run_json", c.run.json);
  b.add(cmd, "json_schema", c.run.json_schema);
  b.add(cmd, "schema_strict", c.run.schema_strict);
  b.add(cmd, "batch", c.run.batch);
  b.add(cmd, "batch_out", c.run.batch_out);
  b.add(cmd, "batch_line_mb", c.run.batch_line_mb);
  b.add(cmd, "parallel", c.run.parallel);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::run(c.run); }});
}

void register_chat(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("chat", "interactive multi-turn chat (reads lines from stdin when not a terminal)");
  add_model_options(b, cmd, c.chat.model, false);
  add_sampling_options(b, cmd, c.chat.sampling);
  add_chat_style(b, cmd, c.chat.style);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::chat(c.chat); }});
}

void register_serve(CLI::App& app, Bindings& b, Commands& c) {
  // Sampling flags become the defaults of requests that leave a field out.
  auto* cmd = app.add_subcommand(
      "serve",
      "OpenAI- and Anthropic-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/messages) and a web "
      "chat page at /");
  dsv4::cli::ServeOptions& s = c.serve;
  add_model_options(b, cmd, s.model, false);
  add_sampling_options(b, cmd, s.sampling);
  b.add(cmd, "host", s.host);
  b.add(cmd, "port", s.port);
  b.add(cmd, "api_key", s.api_key);
  b.add(cmd, "max_queue", s.max_queue);
  b.add(cmd, "parallel", s.parallel);
  b.add(cmd, "model_name", s.model_name);
  b.add(cmd, "cache_entries", s.cache_entries);
  b.add(cmd, "cache_mb", s.cache_mb);
  b.add(cmd, "cache_block", s.cache_block);
  b.add(cmd, "max_body_mb", s.max_body_mb);
  b.add(cmd, "cache_dir", s.cache_dir);
  b.add(cmd, "cache_dir_mb", s.cache_dir_mb);
  b.add(cmd, "model_alias", s.model_aliases);
  b.add(cmd, "strict_model", s.strict_model);
  b.add(cmd, "test_token_delay_ms", s.token_delay_ms);
  b.add(cmd, "test_unsteered_constraints", s.unsteered_constraints);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::serve(c.serve); }});
}

void register_inspect(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("inspect", "validate a checkpoint directory and describe it");
  b.add(cmd, "inspect_dir", c.inspect.dir)->required();
  b.add(cmd, "inspect_json", c.inspect.json);
  b.add(cmd, "inspect_deep", c.inspect.deep);
  b.add(cmd, "mirror", c.inspect.mirrors);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::inspect(c.inspect); }});
}

void register_score(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("score", "teacher-forced logits of a token sequence");
  add_model_options(b, cmd, c.score.model, true);
  b.add(cmd, "tokens_file", c.score.tokens_file)->required();
  b.add(cmd, "logits_out", c.score.logits_out)->required();
  b.add(cmd, "mtp_logits_out", c.score.mtp_logits_out);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::score(c.score); }});
}

void register_generate(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("generate", "greedy continuation of a token sequence");
  add_model_options(b, cmd, c.generate.model, true);
  b.add(cmd, "tokens", c.generate.tokens)->required();
  b.add(cmd, "generate_n", c.generate.n);
  b.add(cmd, "greedy", c.generate.greedy);
  b.add(cmd, "print_ids", c.generate.print_ids);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::generate(c.generate); }});
}

void register_tokenize(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("tokenize", "encode stdin to token ids, or decode ids to text");
  b.add(cmd, "tokenizer", c.tokenize.tokenizer)->required();
  b.add(cmd, "jsonl", c.tokenize.jsonl);
  b.add(cmd, "decode", c.tokenize.decode);
  b.add(cmd, "tokenize_chat", c.tokenize.chat);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::tokenize(c.tokenize); }});
}

void register_settings(CLI::App& app, Commands& c) {
  auto* cmd = app.add_subcommand("settings", "list every flag and DSV4_* environment variable");
  c.entries.push_back({cmd, [] {
                         std::fputs(dsv4::describe_settings().c_str(), stdout);
                         std::printf("%s\n", dsv4::gpu::describe().c_str());
                         return 0;
                       }});
}

void register_synth(CLI::App& app, Bindings& b, Commands& c) {
  // Synthetic checkpoints in the official format (real geometry by default).
  auto* cmd = app.add_subcommand("synth", "write a synthetic checkpoint (random weights, official format)");
  dsv4::SynthOptions& s = c.synth.options;
  b.add(cmd, "synth_out", s.out)->required();
  b.add(cmd, "synth_demo", c.synth.demo);
  b.add(cmd, "synth_preset", c.synth.preset);
  b.add(cmd, "synth_layers", s.layers);
  b.add(cmd, "synth_experts", s.experts);
  b.add(cmd, "synth_experts_per_token", s.experts_per_token);
  b.add(cmd, "synth_hidden", s.hidden);
  b.add(cmd, "synth_moe_inter", s.moe_inter);
  b.add(cmd, "synth_heads", s.heads);
  b.add(cmd, "synth_head_dim", s.head_dim);
  b.add(cmd, "synth_rope_dim", s.rope_dim);
  b.add(cmd, "synth_q_lora", s.q_lora);
  b.add(cmd, "synth_o_groups", s.o_groups);
  b.add(cmd, "synth_o_lora", s.o_lora);
  b.add(cmd, "synth_index_heads", s.index_heads);
  b.add(cmd, "synth_index_head_dim", s.index_head_dim);
  b.add(cmd, "synth_index_topk", s.index_topk);
  b.add(cmd, "synth_vocab", s.vocab);
  b.add(cmd, "synth_hash_layers", s.hash_layers);
  b.add(cmd, "synth_mtp", s.mtp_layers);
  b.add(cmd, "synth_compress_ratios", c.synth.compress_ratios);
  b.add(cmd, "synth_layout", c.synth.layout);
  b.add(cmd, "synth_shard_size", s.shard_bytes);
  b.add(cmd, "synth_seed", s.seed);
  b.add(cmd, "synth_routing_skew", c.synth.routing_skew);
  b.add(cmd, "synth_quiet", c.synth.quiet);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::synth(c.synth); }});
}

void register_relayout(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("relayout", "copy a checkpoint into the official or the contiguous byte layout");
  b.add(cmd, "relayout_src", c.relayout.src)->required();
  b.add(cmd, "relayout_dst", c.relayout.dst)->required();
  b.add(cmd, "relayout_layout", c.relayout.layout);
  b.add(cmd, "relayout_quiet", c.relayout.quiet);
  c.entries.push_back({cmd, [&c] { return dsv4::cli::relayout(c.relayout); }});
}

// dsv4 bench -m DIR: the model under a RAM budget; dsv4 bench kernels: the matmul kernels.
void register_bench(CLI::App& app, Bindings& b, Commands& c) {
  auto* cmd = app.add_subcommand("bench", "benchmarks: -m DIR (the model under a RAM budget), 'kernels' or 'schemas'");
  cmd->require_subcommand(0, 1);
  dsv4::cli::BenchModelOptions& m = c.bench;
  add_model_options(b, cmd, m.model, false);
  b.add(cmd, "bench_prompt_tokens", m.prompt_tokens);
  b.add(cmd, "bench_gen_tokens", m.gen_tokens);
  b.add(cmd, "bench_seed", m.seed);
  b.add(cmd, "bench_prompt_file", m.prompt_file);
  b.add(cmd, "bench_ssd_probe_bytes", m.probe_bytes);
  b.add(cmd, "bench_lookahead", m.lookahead);
  b.add(cmd, "bench_spec", m.spec);
  b.add(cmd, "draft_max", m.draft_max);
  b.add(cmd, "bench_early_hash_reads", m.early_hash_reads);
  b.add(cmd, "bench_soak", m.soak_minutes);
  b.add(cmd, "bench_sessions", m.sessions);
  b.add(cmd, "bench_admit_prompt", m.admit_prompt);
  b.add(cmd, "bench_rounds", m.rounds);
  b.add(cmd, "bench_json", m.json);
  b.add(cmd, "bench_replay", m.replay);
  b.add(cmd, "bench_trace_out", m.trace_out);
  b.add(cmd, "bench_trace_in", m.trace_in);

  auto* kernels = cmd->add_subcommand("kernels", "matmul kernels at V4 Flash shapes vs. the machine's measured limits");
  dsv4::cli::BenchKernelsOptions& k = c.bench_kernels;
  b.add(kernels, "kernels_n", k.n);
  b.add(kernels, "kernels_format", k.formats);
  b.add(kernels, "kernels_mode", k.mode);
  b.add(kernels, "threads", k.threads);
  b.add(kernels, "kernels_seconds", k.seconds);
  b.add(kernels, "kernels_json", k.json);
  c.entries.push_back({kernels, [&c] { return dsv4::cli::bench_kernels(c.bench_kernels); }});
  auto* schemas = cmd->add_subcommand("schemas", "constrained decoding over the JSON Schema corpus: acceptance and mask times");
  dsv4::cli::BenchSchemasOptions& sc = c.bench_schemas;
  b.add(schemas, "schemas_corpus", sc.corpus);
  b.add(schemas, "schemas_tokenizer", sc.tokenizer);
  b.add(schemas, "schemas_json", sc.json);
  c.entries.push_back({schemas, [&c] { return dsv4::cli::bench_schemas(c.bench_schemas); }});
  c.entries.push_back({cmd, [&c] {
                         if (c.bench.model.dir.empty()) throw dsv4::Error("bench: -m DIR is required (or: dsv4 bench kernels)");
                         return dsv4::cli::bench_model(c.bench);
                       }});
}

std::vector<std::string> subcommand_names(CLI::App* app) {
  std::vector<std::string> names;
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

// A mistyped command ("dsv4 rnu", "dsv4 bench kernel") gets a "did you mean" like flags do:
// the first word that is neither a flag nor a known command, where one is expected.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return "";  // flags: CLI11 reports those
    const std::vector<std::string> names = subcommand_names(level);
    if (names.empty()) return "";
    if (std::find(names.begin(), names.end(), word) != names.end()) {
      level = level->get_subcommand(word);
      continue;
    }
    if (level != &app && !level->get_options([](const CLI::Option* o) { return o->get_positional(); }).empty())
      return "";
    const std::string guess = dsv4::closest_match(word, names);
    const std::string what = level == &app ? "command" : level->get_name() + " command";
    return fmt::format("unknown {} \"{}\" ({}: {})", what, word,
                       guess.empty() ? "there are" : fmt::format("did you mean {}? there are", guess),
                       fmt::join(names, ", "));
  }
  return "";
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

int main(int native_argc, char** native_argv) {
  dsv4::platform::init_console();
  // UTF-8 arguments on every OS (Windows passes them wide: a model folder named in Cyrillic).
  std::vector<std::string> args = dsv4::platform::utf8_arguments(native_argc, native_argv);
  std::vector<char*> arg_pointers;
  for (std::string& a : args) arg_pointers.push_back(a.data());
  arg_pointers.push_back(nullptr);
  const int argc = static_cast<int>(args.size());
  char** argv = arg_pointers.data();
  CLI::App app{"dsv4: DeepSeek V4 Flash on an ordinary CPU machine, from the official checkpoint"};
  app.name("dsv4");
  app.require_subcommand(1);
  // The same options on every OS: CLI11 would read "/path" as a "/option" on Windows (before the
  // subcommands are added: they inherit it).
  app.allow_windows_style_options(false);
  Bindings bindings;
  auto commands = std::make_unique<Commands>();
  Commands& c = *commands;
  register_run(app, bindings, c);
  register_chat(app, bindings, c);
  register_serve(app, bindings, c);
  register_inspect(app, bindings, c);
  register_score(app, bindings, c);
  register_generate(app, bindings, c);
  register_tokenize(app, bindings, c);
  register_settings(app, c);
  register_synth(app, bindings, c);
  register_relayout(app, bindings, c);
  register_bench(app, bindings, c);
  // The kernel path is process-wide: every command binds its variable.
  for (CLI::App* cmd : app.get_subcommands([](CLI::App*) { return true; })) bindings.add(cmd, "kernels", c.kernels_path);

  auto error = [](const std::string& message) {
    std::fprintf(stderr, "dsv4: error: %s\n", message.c_str());
    return 2;
  };
  if (argc < 2) {  // no command: show what there is
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  if (const std::vector<std::string> unknown = dsv4::unknown_environment(dsv4::platform::environment()); !unknown.empty()) {
    for (const std::string& p : unknown) error(p);
    return 2;
  }
  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) return error(unknown);
  try {
    app.parse(argc, argv);
    bindings.apply_environment();
    // The kernel path is chosen now, before any command plans memory or loads weights, so a
    // path this CPU cannot run fails first. (The dispatcher reads DSV4_KERNELS itself, since
    // library users and the tests never pass through here; the value was validated above.)
    dsv4::kernels::active_path();
  } catch (const CLI::ExtrasError& e) {
    return error(e.what() + suggest_flag(app, argc, argv));
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // One line, like every other error (CLI11 would add "Run with --help ...").
    return error(std::string(e.what()) + " (see --help)");
  } catch (const dsv4::Error& e) {
    return error(e.what());
  }
  try {
    for (const Commands::Entry& entry : c.entries)
      if (*entry.app) return entry.run();
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
