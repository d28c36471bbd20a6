// dsv4 score: teacher-forced logits for a token file. dsv4 generate: greedy continuation.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "dsv4/cli/common.h"
#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/memory.h"

namespace dsv4::cli {
namespace {

void print_expert_stats(Engine& engine, const ModelOptions& m) {
  if (m.quiet_stats) return;
  std::fprintf(stderr, "%s\n", expert_stats_line(engine.experts().stats(), peak_rss_bytes()).c_str());
}

// Writes to a temporary name first so a failed run never leaves a truncated file behind.
void write_floats(const std::string& path, const std::vector<float>& v) {
  const std::string tmp = path + ".partial";
  {
    std::ofstream f(platform::fs_path(tmp), std::ios::binary | std::ios::trunc);
    if (!f) fail("{}: cannot open for writing", path);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    if (!f) fail("{}: write failed", path);
  }
  if (!platform::rename_replace(tmp, path)) fail("{}: cannot rename from {}", path, tmp);
}

}  // namespace

int score(const ScoreOptions& o) {
  std::vector<int32_t> tokens = parse_token_ids(read_small_file(o.tokens_file, 256 << 20), o.tokens_file);
  if (tokens.empty()) fail("{}: no token ids", o.tokens_file);
  WorkloadShape workload;
  workload.context_tokens = static_cast<int64_t>(tokens.size());
  choose_chunk(workload, o.model.chunk, workload.context_tokens);
  const bool with_mtp = !o.mtp_logits_out.empty();
  workload.logit_rows = workload.context_tokens * (with_mtp ? 2 : 1);
  LoadOptions lo = load_options(o.model, workload);
  lo.mtp = with_mtp ? MtpLoad::kYes : MtpLoad::kNo;
  auto engine = load_engine(resolve_model_dir(o.model), lo).engine;
  const int64_t V = engine->config().vocab_size;
  if (with_mtp && !engine->has_mtp()) fail("--mtp-logits-out: {} has no MTP layer", resolve_model_dir(o.model));
  if (with_mtp && tokens.size() < 2) fail("--mtp-logits-out: {} needs at least 2 token ids", o.tokens_file);
  std::vector<float> logits(tokens.size() * static_cast<size_t>(V));
  SessionState s = engine->new_session();
  engine->forward(s, tokens, logits.data(), LogitRows::kAll);
  write_floats(o.logits_out, logits);
  if (with_mtp) {
    logits.resize((tokens.size() - 1) * static_cast<size_t>(V));
    engine->mtp_score(tokens, logits.data());
    write_floats(o.mtp_logits_out, logits);
  }
  print_expert_stats(*engine, o.model);
  return 0;
}

int generate(const GenerateOptions& o) {
  if (!o.greedy) fail("generate: only --greedy is supported here; use dsv4 run for sampling");
  const std::vector<int32_t>& prompt = o.tokens;
  WorkloadShape workload;
  workload.context_tokens = static_cast<int64_t>(prompt.size()) + o.n;
  choose_chunk(workload, o.model.chunk, static_cast<int64_t>(prompt.size()));
  auto engine = open_engine(o.model, workload).engine;
  const int64_t V = engine->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  SessionState s = engine->new_session();
  engine->forward(s, prompt, logits.data(), LogitRows::kLast);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < o.n; ++i) {
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (logits[v] > logits[best]) best = static_cast<int32_t>(v);
    out.push_back(best);
    if (i + 1 < o.n) engine->forward(s, std::span<const int32_t>(&out.back(), 1), logits.data(), LogitRows::kLast);
  }
  std::string line;
  for (size_t i = 0; i < out.size(); ++i) line += (i ? "," : "") + std::to_string(out[i]);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  print_expert_stats(*engine, o.model);
  return 0;
}

}  // namespace dsv4::cli
