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

namespace dsv4::cli {

// Options shared by every command that loads a model.
struct ModelOptions {
  std::string dir;
  std::string numerics = "fast";  // reference | fast
  int threads = 0;
};

struct ScoreOptions {
  ModelOptions model;
  std::string tokens_file;
  std::string logits_out;
  int64_t chunk = 0;
};
int score(const ScoreOptions& o);

struct GenerateOptions {
  ModelOptions model;
  std::string tokens;  // "id,id,..."
  int64_t n = 16;
  bool greedy = true;
  bool print_ids = true;
  int64_t chunk = 0;
};
int generate(const GenerateOptions& o);

}  // namespace dsv4::cli
