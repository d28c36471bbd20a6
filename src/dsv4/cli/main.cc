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
