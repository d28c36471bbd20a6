// dsv4 bench schemas: the JSON Schema corpus (tests/schema_corpus) stepped token by token, as
// the public mask benchmarks do. For each schema: compile it (grammar and its binding to the
// vocabulary), then for each instance the source marks valid or invalid, tokenize it with the
// real vocabulary and walk the matcher along it: a mask before every token (timed), the token
// must be allowed, then the end token must be. Reports what compiles, valid instances accepted,
// invalid ones rejected, and the compile and per-token mask times (mean, p50, p99, max).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/bench/bench.h"
#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/json_schema.h"
#include "dsv4/constrain/matcher.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/util/error.h"

namespace dsv4::cli {
namespace {

using constrain::Json;
using Clock = std::chrono::steady_clock;

constexpr size_t kV4Vocab = 129280;  // logits are this wide whatever the tokenizer file holds

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Stats {
  std::vector<double> v;
  double mean() const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  double quantile(double q) {  // nearest rank
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t rank = q <= 0 ? 1 : static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(rank, v.size()) - 1];
  }
};

struct Tally {
  int schemas = 0, compiled = 0, valid = 0, valid_accepted = 0, invalid = 0, invalid_rejected = 0;
  long tokens = 0;
  std::map<std::string, int> refused_by;
};

// Walks `tokens` under the constraint: whether every token and then the end were allowed.
bool walk(const constrain::CompiledConstraint& c, const std::vector<int32_t>& tokens, int32_t end,
          std::vector<float>& logits, Stats& mask_us) {
  auto run = c.begin(std::span<const int32_t>(&end, 1));
  auto masked = [&]() {
    std::fill(logits.begin(), logits.end(), 0.0f);
    const auto t = Clock::now();
    run->mask(logits);
    mask_us.v.push_back(seconds_since(t) * 1e6);
  };
  for (int32_t t : tokens) {
    masked();
    if (static_cast<size_t>(t) >= logits.size() || std::isinf(logits[t])) return false;
    run->advance(t);
  }
  masked();
  return !std::isinf(logits[end]);
}

}  // namespace

int bench_schemas(const BenchSchemasOptions& o) {
  const text::Tokenizer tok = text::Tokenizer::from_file(o.tokenizer);
  const std::optional<text::TokenId> eos = tok.eos_id();
  if (!eos) throw Error(fmt::format("{}: the tokenizer has no end-of-sentence token", o.tokenizer));
  auto t0 = Clock::now();
  const auto vocab = std::make_shared<const constrain::TokenTrie>(tok);
  const double trie_s = seconds_since(t0);
  std::vector<float> logits(std::max<size_t>(kV4Vocab, static_cast<size_t>(vocab->vocab_size())), 0.0f);

  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (!std::filesystem::is_directory(o.corpus, ec)) throw Error(fmt::format("{}: not a folder", o.corpus));
  for (const auto& e : std::filesystem::directory_iterator(o.corpus))
    if (e.path().extension() == ".jsonl") files.push_back(e.path());
  if (files.empty()) throw Error(fmt::format("{}: no .jsonl corpus files", o.corpus));
  std::sort(files.begin(), files.end());

  Stats compile_ms, mask_us;
  Json report = Json::object();
  if (!o.json)
    std::printf("bench schemas: %s, vocabulary %zu tokens (trie %.1f ms), one thread\n", o.corpus.c_str(),
                static_cast<size_t>(vocab->vocab_size()), trie_s * 1e3);
  for (const auto& file : files) {
    std::ifstream in(file);
    Tally t;
    Stats file_mask;
    std::string line;
    while (std::getline(in, line)) {
      const Json entry = Json::parse(line);
      ++t.schemas;
      std::unique_ptr<constrain::CompiledConstraint> c;
      t0 = Clock::now();
      try {
        constrain::AnswerFormat f;
        f.content_schema = &entry["schema"];
        f.content_where = "schema";
        c = std::make_unique<constrain::CompiledConstraint>(constrain::build_answer_grammar(f), vocab);
      } catch (const constrain::SchemaError& e) {
        ++t.refused_by[e.keyword().empty() ? "(schema)" : e.keyword()];
        continue;
      } catch (const Error&) {
        ++t.refused_by["(no finite value)"];
        continue;
      }
      compile_ms.v.push_back(seconds_since(t0) * 1e3);
      ++t.compiled;
      for (const char* kind : {"valid", "invalid"}) {
        const bool valid = kind[0] == 'v';
        for (const Json& instance : entry[kind]) {
          const std::vector<int32_t> tokens = tok.encode_plain(instance.dump());
          t.tokens += static_cast<long>(tokens.size());
          const size_t before = mask_us.v.size();
          const bool accepted = walk(*c, tokens, *eos, logits, mask_us);
          file_mask.v.insert(file_mask.v.end(), mask_us.v.begin() + static_cast<std::ptrdiff_t>(before), mask_us.v.end());
          if (valid) ++t.valid, t.valid_accepted += accepted;
          else ++t.invalid, t.invalid_rejected += !accepted;
        }
      }
    }
    std::string refused;
    for (const auto& [why, n] : t.refused_by) refused += fmt::format(" {} {};", why, n);
    const std::string name = file.filename().string();
    if (!o.json)
      std::printf("%-26s compiled %3d/%3d  valid accepted %4d/%4d  invalid rejected %4d/%4d  masks %7zu  mean %.1f us  "
                "p99 %.1f us\n  refused by:%s\n",
                name.c_str(), t.compiled, t.schemas, t.valid_accepted, t.valid, t.invalid_rejected, t.invalid,
                file_mask.v.size(), file_mask.mean(), file_mask.quantile(0.99), refused.c_str());
    report[name] = {{"schemas", t.schemas},          {"compiled", t.compiled},
                    {"valid", t.valid},              {"valid_accepted", t.valid_accepted},
                    {"invalid", t.invalid},          {"invalid_rejected", t.invalid_rejected},
                    {"masks", file_mask.v.size()},   {"mask_us_mean", file_mask.mean()},
                    {"mask_us_p99", file_mask.quantile(0.99)}};
  }
  const double mean = mask_us.mean(), p50 = mask_us.quantile(0.5), p99 = mask_us.quantile(0.99), max = mask_us.quantile(1);
  const double c50 = compile_ms.quantile(0.5), c99 = compile_ms.quantile(0.99), cmax = compile_ms.quantile(1);
  if (!o.json) {
    std::printf("mask per token: %zu masks, mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us\n", mask_us.v.size(), mean,
              p50, p99, max);
    std::printf("compile (grammar + vocabulary binding): %zu schemas, p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
                compile_ms.v.size(), c50, c99, cmax);
    return 0;
  }
  {
    report["mask_us"] = {{"count", mask_us.v.size()}, {"mean", mean}, {"p50", p50}, {"p99", p99}, {"max", max}};
    report["compile_ms"] = {{"count", compile_ms.v.size()}, {"p50", c50}, {"p99", c99}, {"max", cmax}};
    std::printf("%s\n", report.dump().c_str());
  }
  return 0;
}

}  // namespace dsv4::cli
