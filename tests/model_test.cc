// The forward pass against the fixtures' Hugging Face float32 references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "dsv4/io/safetensors.h"
#include "dsv4/model/compressor.h"
#include "dsv4/model/engine.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using kernels::Numerics;
using test::fixture;

struct Reference {
  nlohmann::json doc;
  SafetensorsFile logits;

  explicit Reference(const std::string& name)
      : doc(nlohmann::json::parse(test::read_file(fixture(name) + "/reference.json"))),
        logits(SafetensorsFile::open(fixture(name) + "/reference_logits.safetensors")) {}

  std::vector<float> tensor(const std::string& name) const {
    const TensorInfo* info = logits.find(name);
    EXPECT_NE(info, nullptr) << name;
    std::vector<float> v(info->numel());
    logits.read(*info, v.data());
    return v;
  }
};

std::vector<int32_t> ids(const nlohmann::json& a) { return a.get<std::vector<int32_t>>(); }

int64_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

std::vector<float> score(Engine& e, const std::vector<int32_t>& tokens, int64_t chunk = 0) {
  std::vector<float> out(tokens.size() * e.config().vocab_size);
  SessionState s = e.new_session();
  e.forward(s, tokens, out.data(), LogitRows::kAll, chunk);
  return out;
}

std::unique_ptr<Engine> open(const std::string& name, Numerics n, int threads = 0) {
  EngineOptions o;
  o.numerics = n;
  o.threads = threads;
  o.max_rows = 1024;  // every fixture sequence in one pass unless a test chunks it
  return test::open_engine(fixture(name), o);
}

class ModelReference : public ::testing::TestWithParam<std::string> {};

// Every position of every reference sequence: max |logit - reference| <= 1e-3 and the same argmax.
TEST_P(ModelReference, TeacherForcedLogits) {
  Reference ref(GetParam());
  auto engine = open(GetParam(), Numerics::kReference);
  const int64_t V = engine->config().vocab_size;
  for (const auto& seq : ref.doc["sequences"]) {
    std::vector<int32_t> tokens = ids(seq["tokens"]);
    std::vector<float> got = score(*engine, tokens);
    std::vector<float> want = ref.tensor(seq["logits_tensor"]);
    ASSERT_EQ(got.size(), want.size());
    float worst = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
      for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(got[p * V + v] - want[p * V + v]));
      EXPECT_EQ(argmax(&got[p * V], V), seq["argmax"][p].get<int64_t>()) << seq["name"] << " position " << p;
    }
    EXPECT_LE(worst, 1e-3f) << seq["name"];
    std::printf("%s %s: max |dlogit| = %.3g over %zu positions\n", GetParam().c_str(),
                seq["name"].get<std::string>().c_str(), worst, tokens.size());
  }
}

// Greedy continuations identical to the reference for their full length; the logits of
// every step within 1e-3 of the reference's cached decode.
TEST_P(ModelReference, GreedyContinuations) {
  Reference ref(GetParam());
  auto engine = open(GetParam(), Numerics::kReference);
  const int64_t V = engine->config().vocab_size;
  for (const auto& g : ref.doc["greedy"]) {
    std::vector<int32_t> prompt = ids(g["prompt"]), want = ids(g["new_tokens"]);
    std::vector<float> steps = ref.tensor(g["logits_tensor"]);
    SessionState s = engine->new_session();
    std::vector<float> logits(V);
    engine->forward(s, prompt, logits.data(), LogitRows::kLast);
    float worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(logits[v] - steps[i * V + v]));
      int32_t next = static_cast<int32_t>(argmax(logits.data(), V));
      ASSERT_EQ(next, want[i]) << "greedy " << g["id"] << " step " << i;
      engine->forward(s, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
    }
    EXPECT_LE(worst, 1e-3f) << "greedy " << g["id"];
  }
}

// Bit-identical logits whatever the prefill chunking and the thread count.
TEST_P(ModelReference, ChunkAndThreadInvariance) {
  Reference ref(GetParam());
  const auto& seq = ref.doc["sequences"][0];
  std::vector<int32_t> tokens = ids(seq["tokens"]);
  if (GetParam() == "flashlike") tokens.resize(300);  // keeps chunk=1 affordable under ASan
  auto one = open(GetParam(), Numerics::kReference, 1);
  auto two = open(GetParam(), Numerics::kReference, 2);
  std::vector<float> whole = score(*two, tokens);
  for (int64_t chunk : {1, 3, 7, 64}) {
    std::vector<float> got = score(*two, tokens, chunk);
    EXPECT_EQ(std::memcmp(got.data(), whole.data(), whole.size() * 4), 0) << "chunk " << chunk;
  }
  std::vector<float> single = score(*one, tokens, 7);
  EXPECT_EQ(std::memcmp(single.data(), whole.data(), whole.size() * 4), 0) << "1 thread";
  for (Numerics n : {Numerics::kFast}) {
    auto f1 = open(GetParam(), n, 1);
    auto f2 = open(GetParam(), n, 2);
    std::vector<float> a = score(*f1, tokens), b = score(*f2, tokens, 5);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "fast numerics, 1 vs 2 threads, chunk 5";
  }
}

// Fast numerics: argmax equal to the reference at >= 98 % of positions, greedy identical
// for at least the first 8 tokens.
TEST_P(ModelReference, FastNumerics) {
  Reference ref(GetParam());
  auto engine = open(GetParam(), Numerics::kFast);
  const int64_t V = engine->config().vocab_size;
  int64_t agree = 0, total = 0;
  float worst = 0;
  for (const auto& seq : ref.doc["sequences"]) {
    std::vector<int32_t> tokens = ids(seq["tokens"]);
    std::vector<float> got = score(*engine, tokens);
    std::vector<float> want = ref.tensor(seq["logits_tensor"]);
    for (size_t p = 0; p < tokens.size(); ++p) {
      agree += argmax(&got[p * V], V) == seq["argmax"][p].get<int64_t>();
      ++total;
      for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(got[p * V + v] - want[p * V + v]));
    }
  }
  std::printf("%s fast numerics: argmax agreement %lld/%lld, max |dlogit| = %.3g\n", GetParam().c_str(),
              static_cast<long long>(agree), static_cast<long long>(total), worst);
  EXPECT_GE(agree * 100, total * 98);
  for (const auto& g : ref.doc["greedy"]) {
    std::vector<int32_t> prompt = ids(g["prompt"]), want = ids(g["new_tokens"]);
    SessionState s = engine->new_session();
    std::vector<float> logits(V);
    engine->forward(s, prompt, logits.data(), LogitRows::kLast);
    for (size_t i = 0; i < 8; ++i) {
      int32_t next = static_cast<int32_t>(argmax(logits.data(), V));
      ASSERT_EQ(next, want[i]) << "greedy " << g["id"] << " step " << i;
      engine->forward(s, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelReference, ::testing::Values("tiny-a", "flashlike"));

// The indexer's top-k selection picks exactly the set a full sort by (score descending, index
// ascending) puts first, ties included, at the sizes a CSA layer sees (k = 512 of up to 4,096
// blocks) and at the edges (k = n, k = 1, n = 1).
TEST(IndexerTopK, SameSetAsAFullSortWithTies) {
  std::mt19937 rng(7);
  const int64_t sizes[][2] = {{1, 1}, {5, 5}, {9, 1}, {100, 4}, {4096, 512}, {1500, 512}, {513, 512}, {64, 63}};
  for (const auto& size : sizes) {
    const int64_t n = size[0], k = size[1];
    for (int levels : {2, 7, 1000000}) {  // few distinct scores: many ties
      std::vector<float> scores(n);
      std::uniform_int_distribution<int> level(0, levels - 1);
      for (float& s : scores) s = static_cast<float>(level(rng)) * 0.25f - 3.0f;
      std::vector<int32_t> order(n), chosen(k);
      pick_top_k(scores.data(), n, k, order.data(), chosen.data());

      std::vector<int32_t> sorted(n);
      for (int64_t e = 0; e < n; ++e) sorted[e] = static_cast<int32_t>(e);
      std::stable_sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
      std::vector<int32_t> expected(sorted.begin(), sorted.begin() + k);
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(chosen, expected) << "n " << n << " k " << k << " levels " << levels;
    }
  }
}

// The review commands: score writes raw float32 [n, vocab]; generate prints ids.
TEST(ModelCli, ScoreAndGenerate) {
  Reference ref("tiny-a");
  test::TempDir tmp;
  const auto& seq = ref.doc["sequences"][1];
  std::string tokens;
  for (auto& t : seq["tokens"]) tokens += std::to_string(t.get<int>()) + (tokens.size() % 3 ? " " : ",\n");
  test::write_file(tmp / "tokens.txt", tokens);
  auto r = test::run_dsv4("score -m " + fixture("tiny-a") + " --tokens-file " + tmp / "tokens.txt" + " --logits-out " +
                          tmp / "out.bin" + " --numerics reference --chunk 5 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string bytes = test::read_file(tmp / "out.bin");
  std::vector<float> want = ref.tensor(seq["logits_tensor"]);
  ASSERT_EQ(bytes.size(), want.size() * 4);
  const float* got = reinterpret_cast<const float*>(bytes.data());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3) << i;

  const auto& g = ref.doc["greedy"][4];
  std::string prompt;
  for (auto& t : g["prompt"]) prompt += (prompt.empty() ? "" : ",") + std::to_string(t.get<int>());
  r = test::run_dsv4("generate -m " + fixture("tiny-a") + " --tokens " + prompt +
                     " -n 12 --greedy --print-ids --numerics reference --chunk 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string want_ids;
  for (int i = 0; i < 12; ++i) want_ids += (i ? "," : "") + std::to_string(g["new_tokens"][i].get<int>());
  EXPECT_EQ(r.out, want_ids + "\n");

  r = test::run_dsv4("generate -m " + fixture("tiny-a") + " --tokens 1,2,99999 -n 2 --greedy --print-ids");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("token id 99999 at index 2 is outside the vocabulary"), std::string::npos) << r.err;
  r = test::run_dsv4("score -m " + fixture("tiny-a") + " --tokens-file " + tmp / "missing.txt" + " --logits-out " +
                     tmp / "x.bin");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
}

// Resident experts that say they hold `capacity` at a time and record the engine's guesses
// and prefetches in order.
class GuessRecorder final : public ExpertProvider {
 public:
  struct Call {
    char kind;  // 'g' predict / expect, 'f' prefetch
    int layer;
    size_t size;
  };
  GuessRecorder(const Checkpoint& ck, int64_t capacity) : inner_(make_resident_experts(ck)), capacity_(capacity) {}
  void prefetch(int layer, std::span<const int> experts) override {
    calls.push_back({'f', layer, experts.size()});
    inner_->prefetch(layer, experts);
  }
  void predict(int layer, std::span<const int> experts) override { calls.push_back({'g', layer, experts.size()}); }
  void expect(int layer, std::span<const int> experts) override { calls.push_back({'g', layer, experts.size()}); }
  bool wants_predictions() const override { return true; }
  int64_t capacity() const override { return capacity_; }
  const ExpertWeights& acquire(int layer, int expert) override { return inner_->acquire(layer, expert); }
  void release(int layer, int expert) override { inner_->release(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  std::vector<Call> calls;

 private:
  std::unique_ptr<ExpertProvider> inner_;
  int64_t capacity_;
};

// A prefill chunk whose MoE uses every expert of a layer leaves a cache of fewer slots no
// room for the next layer's guess (its reads would be evicted before that layer runs), and
// no guess is longer than the cache. A decode step (6 of 16 experts) still guesses ahead.
// The logits never change.
TEST(ExpertLookahead, GuessesFitWhatTheCacheKeeps) {
  const std::string dir = fixture("flashlike");
  Checkpoint ck = Checkpoint::open(dir);
  const ModelConfig& c = ck.config();
  const int E = c.n_routed_experts;
  std::vector<int32_t> prompt(256);
  std::mt19937 rng(7);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
  const int32_t next = 5;
  auto run = [&](int64_t capacity, std::vector<float>& logits) {
    auto provider = std::make_unique<GuessRecorder>(ck, capacity);
    GuessRecorder& rec = *provider;
    EngineOptions o;
    o.threads = 1;
    auto engine = test::open_engine(dir, o, std::move(provider));
    SessionState s = engine->new_session();
    logits.assign(c.vocab_size, 0.0f);
    engine->forward(s, prompt, logits.data(), LogitRows::kLast);
    const size_t prefill_calls = rec.calls.size();
    std::vector<float> step(c.vocab_size);
    engine->forward(s, std::span<const int32_t>(&next, 1), step.data(), LogitRows::kLast);
    logits.insert(logits.end(), step.begin(), step.end());
    // Early guesses: one for layer l + 1 between layer l's own guess and its prefetch.
    int early_prefill = 0, early_decode = 0;
    for (size_t i = 0; i < rec.calls.size(); ++i) {
      const GuessRecorder::Call& g = rec.calls[i];
      if (g.kind != 'g') continue;
      EXPECT_LE(static_cast<int64_t>(g.size), capacity < 0 ? E : capacity) << "call " << i;
      const size_t f = static_cast<size_t>(std::find_if(rec.calls.begin() + static_cast<ptrdiff_t>(i), rec.calls.end(),
                                                        [](const GuessRecorder::Call& x) { return x.kind == 'f'; }) -
                                           rec.calls.begin());
      if (f < rec.calls.size() && rec.calls[f].layer + 1 == g.layer) ++(i < prefill_calls ? early_prefill : early_decode);
    }
    for (size_t i = 0; i < prefill_calls; ++i) {
      if (rec.calls[i].kind != 'f') continue;
      EXPECT_EQ(static_cast<int>(rec.calls[i].size), E) << "the prompt uses every expert";
    }
    return std::make_pair(early_prefill, early_decode);
  };
  std::vector<float> unlimited, small;
  const auto [prefill_unlimited, decode_unlimited] = run(-1, unlimited);
  const auto [prefill_small, decode_small] = run(E - 2, small);
  EXPECT_EQ(prefill_unlimited, c.num_layers - 1);  // the test sees early guesses where they pay
  EXPECT_EQ(prefill_small, 0);
  EXPECT_EQ(decode_unlimited, c.num_layers - 1);
  EXPECT_EQ(decode_small, c.num_layers - 1);
  EXPECT_EQ(unlimited, small);
}

}  // namespace
}  // namespace dsv4
