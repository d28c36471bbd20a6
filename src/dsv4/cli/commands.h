// Subcommand entry points. main.cc parses flags (the only file that includes CLI11) and
// calls one of these; each returns the process exit code.
#pragma once

#include <string>

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

}  // namespace dsv4::cli
