// dsv4 command line. The only translation unit that includes CLI11 (it is slow to compile).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "dsv4/cli/commands.h"
#include "dsv4/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv4: DeepSeek V4 Flash on an ordinary CPU machine"};
  app.require_subcommand(1);

  dsv4::cli::InspectOptions inspect;
  auto* inspect_cmd = app.add_subcommand("inspect", "validate a checkpoint directory and describe it");
  inspect_cmd->add_option("dir", inspect.dir, "checkpoint directory")->required();
  inspect_cmd->add_flag("--json", inspect.json, "print JSON");

  auto add_model_options = [](CLI::App* cmd, dsv4::cli::ModelOptions& m) {
    cmd->add_option("-m,--model", m.dir, "checkpoint directory")->required();
    cmd->add_option("--numerics", m.numerics, "reference (float32 activations) or fast (quantized activations)")
        ->check(CLI::IsMember({"reference", "fast"}));
    cmd->add_option("--threads", m.threads, "compute threads (0 = all CPUs)")->check(CLI::Range(0, 1024));
  };

  dsv4::cli::ScoreOptions score;
  auto* score_cmd = app.add_subcommand("score", "teacher-forced logits of a token sequence");
  add_model_options(score_cmd, score.model);
  score_cmd->add_option("--tokens-file", score.tokens_file, "token ids separated by whitespace or commas")->required();
  score_cmd->add_option("--logits-out", score.logits_out, "output: float32 little-endian [n_tokens, vocab]")->required();
  score_cmd->add_option("--chunk", score.chunk, "prefill chunk size (0 = whole sequence)")->check(CLI::Range(0, 1 << 30));

  dsv4::cli::GenerateOptions gen;
  auto* gen_cmd = app.add_subcommand("generate", "greedy continuation of a token sequence");
  add_model_options(gen_cmd, gen.model);
  gen_cmd->add_option("--tokens", gen.tokens, "prompt token ids, comma-separated")->required();
  gen_cmd->add_option("-n", gen.n, "tokens to generate")->check(CLI::Range(0, 1 << 30));
  gen_cmd->add_flag("--greedy", gen.greedy, "argmax decoding (the only mode of this command)");
  gen_cmd->add_flag("--print-ids", gen.print_ids, "print the generated ids comma-separated");
  gen_cmd->add_option("--chunk", gen.chunk, "prefill chunk size (0 = whole prompt)")->check(CLI::Range(0, 1 << 30));

  dsv4::cli::TokenizeOptions tokenize;
  auto* tokenize_cmd = app.add_subcommand("tokenize", "encode stdin to token ids, or decode ids to text");
  tokenize_cmd->add_option("-t,--tokenizer", tokenize.tokenizer, "tokenizer.json")->required();
  tokenize_cmd->add_flag("--jsonl", tokenize.jsonl, "one JSON string (or, with --decode, one JSON array of ids) per line");
  tokenize_cmd->add_flag("--decode", tokenize.decode, "ids in, text out");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*inspect_cmd) return dsv4::cli::inspect(inspect);
    if (*score_cmd) return dsv4::cli::score(score);
    if (*gen_cmd) return dsv4::cli::generate(gen);

    if (*tokenize_cmd) return dsv4::cli::tokenize(tokenize);
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
