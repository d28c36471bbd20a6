// dsv4 score: teacher-forced logits for a token file. dsv4 generate: greedy continuation.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dsv4/cli/commands.h"
#include "dsv4/model/engine.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/memory.h"

namespace dsv4::cli {
namespace {

kernels::Numerics parse_numerics(const std::string& s) {
  if (s == "reference") return kernels::Numerics::kReference;
  if (s == "fast") return kernels::Numerics::kFast;
  fail("--numerics must be \"reference\" or \"fast\", got \"{}\"", s);
}

// Token ids separated by whitespace and/or commas.
std::vector<int32_t> parse_token_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    char ch = text[i];
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      ++i;
      continue;
    }
    if (ch < '0' || ch > '9') fail("{}: unexpected character '{}' at offset {} (expected token ids)", what, ch, i);
    int64_t v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      v = v * 10 + (text[i] - '0');
      if (v > 2'000'000'000) fail("{}: token id at offset {} is too large", what, i);
      ++i;
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) fail("{}: no token ids", what);
  return ids;
}

std::unique_ptr<Engine> open_engine(const ModelOptions& m, const WorkloadShape& workload) {
  EngineOptions eo;
  eo.numerics = parse_numerics(m.numerics);
  eo.threads = m.threads;
  eo.ram = m.ram;
  eo.workload = workload;
  eo.store.backend = parse_io_backend(m.io);
  return Engine::open(m.dir, eo);
}

void print_stats(Engine& engine, const ModelOptions& m) {
  if (m.quiet_stats) return;
  std::fprintf(stderr, "%s\n", stats_line(engine.experts().stats(), peak_rss_bytes()).c_str());
}

}  // namespace

int score(const ScoreOptions& o) {
  parse_ram(o.model.ram);  // a bad --ram fails before any work
  std::vector<int32_t> tokens = parse_token_list(read_small_file(o.tokens_file, 256 << 20), o.tokens_file);
  WorkloadShape workload;
  workload.context_tokens = static_cast<int64_t>(tokens.size());
  workload.chunk_tokens = o.chunk > 0 ? o.chunk : workload.context_tokens;
  workload.logit_rows = workload.context_tokens;
  auto engine = open_engine(o.model, workload);
  const int64_t V = engine->config().vocab_size;
  std::vector<float> logits(tokens.size() * static_cast<size_t>(V));
  SessionState s = engine->new_session();
  engine->forward(s, tokens, logits.data(), /*all_positions=*/true, o.chunk);
  // Write to a temporary name first so a failed run never leaves a truncated file behind.
  const std::string tmp = o.logits_out + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("{}: cannot open for writing", o.logits_out);
    f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
    if (!f) fail("{}: write failed", o.logits_out);
  }
  if (std::rename(tmp.c_str(), o.logits_out.c_str()) != 0) fail("{}: cannot rename from {}", o.logits_out, tmp);
  print_stats(*engine, o.model);
  return 0;
}

int generate(const GenerateOptions& o) {
  if (!o.greedy) fail("generate: only --greedy is supported here; use dsv4 run for sampling");
  if (o.n < 0) fail("-n must be >= 0");
  parse_ram(o.model.ram);
  std::vector<int32_t> prompt = parse_token_list(o.tokens, "--tokens");
  WorkloadShape workload;
  workload.context_tokens = static_cast<int64_t>(prompt.size()) + o.n;
  workload.chunk_tokens = o.chunk > 0 ? o.chunk : static_cast<int64_t>(prompt.size());
  auto engine = open_engine(o.model, workload);
  const int64_t V = engine->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  SessionState s = engine->new_session();
  engine->forward(s, prompt, logits.data(), /*all_positions=*/false, o.chunk);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < o.n; ++i) {
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (logits[v] > logits[best]) best = static_cast<int32_t>(v);
    out.push_back(best);
    if (i + 1 < o.n) engine->forward(s, std::span<const int32_t>(&out.back(), 1), logits.data(), false);
  }
  std::string line;
  for (size_t i = 0; i < out.size(); ++i) line += (i ? "," : "") + std::to_string(out[i]);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  print_stats(*engine, o.model);
  return 0;
}

}  // namespace dsv4::cli
