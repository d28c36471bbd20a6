// Sampling and the generation loop (token level; text comes from a stand-in detokenizer).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dsv4/experts/expert_store.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/runtime/sampler.h"
#include "dsv4/util/error.h"
#include "test_util.h"

namespace dsv4 {
namespace {

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 0.7f) * 3;
  auto draw = [&](uint64_t seed) {
    SamplingParams p;
    p.temperature = 1.3f;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits, {}));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, TopKTopPMinPRestrictTheCandidates) {
  std::vector<float> logits = {5.0f, 4.0f, 3.0f, 0.0f, -1.0f};
  for (int trial = 0; trial < 300; ++trial) {
    SamplingParams k;
    k.top_k = 2;
    k.seed = trial;
    EXPECT_LT(Sampler(k).sample(logits, {}), 2);
    SamplingParams p;
    p.top_p = 0.5f;  // the top token alone has ~0.66 of the mass
    p.seed = trial;
    EXPECT_EQ(Sampler(p).sample(logits, {}), 0);
    SamplingParams m;
    m.min_p = 0.3f;  // keeps tokens with p >= 0.3 * p(top): ids 0 and 1
    m.seed = trial;
    EXPECT_LT(Sampler(m).sample(logits, {}), 2);
  }
}

TEST(Sampler, RepetitionPenaltyAppliesOncePerToken) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  // Token 0 seen three times: 3/2 = 1.5 < 2, so token 1 wins; applied once, not three times.
  std::vector<int32_t> history = {0, 0, 0};
  EXPECT_EQ(Sampler(p).sample(logits, history), 1);
  std::vector<float> close = {3.0f, 1.4f};
  EXPECT_EQ(Sampler(p).sample(close, history), 0);
}

// OpenAI's penalties: logit - count x frequency - presence, over the generated tokens only.
TEST(Sampler, FrequencyAndPresencePenaltiesCountTheGeneratedTokens) {
  const std::vector<float> logits = {3.0f, 2.5f, 1.0f};
  const std::vector<int32_t> history = {0, 0, 1, 0, 0};  // prompt {0, 0}, generated {1, 0, 0}
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.3f;  // token 0 (generated twice): 3 - 0.6 = 2.4; token 1: 2.5 - 0.3 = 2.2
  EXPECT_EQ(Sampler(p).sample(logits, history, 2), 0);
  p.frequency_penalty = 0.5f;  // token 0: 3 - 1.0 = 2.0; token 1: 2.5 - 0.5 = 2.0: lowest id
  EXPECT_EQ(Sampler(p).sample(logits, history, 2), 0);
  p.frequency_penalty = 0.6f;  // token 0: 1.8; token 1: 1.9
  EXPECT_EQ(Sampler(p).sample(logits, history, 2), 1);
  EXPECT_EQ(Sampler(p).sample(logits, history, 5), 0);  // nothing generated yet: no penalty
  p.frequency_penalty = 0;
  p.presence_penalty = 1.0f;  // once per generated token: 2.0 vs 1.5 vs 1.0
  EXPECT_EQ(Sampler(p).sample(logits, history, 2), 0);
  p.presence_penalty = -2.0f;  // negative: encourages what was generated; token 2 untouched
  EXPECT_EQ(Sampler(p).sample(std::vector<float>{1.0f, 1.0f, 2.5f}, history, 2), 0);
  p.presence_penalty = 2.5f;
  EXPECT_THROW(p.validate(), Error);
  p.presence_penalty = 0;
  p.frequency_penalty = std::nanf("");
  EXPECT_THROW(p.validate(), Error);
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(p.validate(), Error);
  p = {};
  p.temperature = -1;
  EXPECT_THROW(p.validate(), Error);
  p = {};
  p.repetition_penalty = std::nanf("");
  EXPECT_THROW(p.validate(), Error);
}

TEST(Sampler, DefaultsFromGenerationConfig) {
  SamplingParams p = sampling_defaults_from(test::fixture("tiny-a") + "/generation_config.json");
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  test::TempDir tmp;
  test::write_file(tmp / "g.json", R"({"do_sample": false, "temperature": 0.6})");
  EXPECT_TRUE(sampling_defaults_from(tmp / "g.json").greedy());
  test::write_file(tmp / "bad.json", R"({"top_p": 7})");
  EXPECT_THROW(sampling_defaults_from(tmp / "bad.json"), Error);
}

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.numerics = kernels::Numerics::kReference;
    engine_ = test::open_engine(test::fixture("tiny-a"), o);
  }
  // Each token becomes "<id>" so stop strings can be placed on token boundaries or inside them.
  GenerationCallbacks callbacks(std::string* streamed) {
    GenerationCallbacks cb;
    cb.detokenize = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
    cb.on_text = [streamed](const std::string& t) { *streamed += t; };
    return cb;
  }
  std::vector<int32_t> greedy_ids(const std::vector<int32_t>& prompt, int n) {
    SessionState s = engine_->new_session();
    std::vector<float> logits(engine_->config().vocab_size);
    engine_->forward(s, prompt, logits.data(), LogitRows::kLast);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      int32_t best = 0;
      for (int v = 1; v < engine_->config().vocab_size; ++v)
        if (logits[v] > logits[best]) best = v;
      out.push_back(best);
      engine_->forward(s, std::span<const int32_t>(&best, 1), logits.data(), LogitRows::kLast);
    }
    return out;
  }
  GenerationRequest greedy_request(int64_t max_tokens) const {
    GenerationRequest r;
    r.prompt = prompt_;
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    return r;
  }
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> prompt_ = {496, 499, 84, 101, 288, 301, 101, 390};
};

TEST_F(GeneratorTest, GreedyMatchesArgmaxDecodingAndMaxTokens) {
  GenerationRequest r;
  r.prompt = prompt_;
  r.sampling.temperature = 0;
  r.max_tokens = 10;
  std::string streamed;
  SessionState s = engine_->new_session();
  GenerationResult g = generate(*engine_, s, r, callbacks(&streamed));
  EXPECT_EQ(g.tokens, greedy_ids(prompt_, 10));
  EXPECT_EQ(g.finish, FinishReason::kLength);
  EXPECT_EQ(streamed, g.text);
  EXPECT_EQ(g.stats.generated_tokens, 10);
  EXPECT_EQ(s.position, static_cast<int64_t>(prompt_.size()) + 9);  // the last token is not fed
}

TEST_F(GeneratorTest, StopStringIsHeldBackAndExcluded) {
  std::vector<int32_t> ids = greedy_ids(prompt_, 6);
  GenerationRequest r;
  r.prompt = prompt_;
  r.sampling.temperature = 0;
  r.max_tokens = 20;
  // Stop in the middle of token 3's text: "<id3" + ">" ... the stop string spans a boundary.
  std::string before = "<" + std::to_string(ids[0]) + "><" + std::to_string(ids[1]) + ">";
  r.stop_strings = {std::to_string(ids[1]) + "><" + std::to_string(ids[2])};
  std::string streamed;
  SessionState s = engine_->new_session();
  GenerationResult g = generate(*engine_, s, r, callbacks(&streamed));
  EXPECT_EQ(g.finish, FinishReason::kStop);
  EXPECT_EQ(g.text, "<" + std::to_string(ids[0]) + "><");
  EXPECT_EQ(streamed, g.text);
  EXPECT_EQ(g.tokens.size(), 3u);
}

TEST_F(GeneratorTest, StopIdEndsWithoutText) {
  std::vector<int32_t> ids = greedy_ids(prompt_, 4);
  GenerationRequest r;
  r.prompt = prompt_;
  r.sampling.temperature = 0;
  r.max_tokens = 20;
  r.stop_ids = {ids[2]};
  std::string streamed;
  SessionState s = engine_->new_session();
  GenerationResult g = generate(*engine_, s, r, callbacks(&streamed));
  EXPECT_EQ(g.finish, FinishReason::kStop);
  EXPECT_EQ(g.tokens.size(), 3u);
  EXPECT_EQ(g.text, "<" + std::to_string(ids[0]) + "><" + std::to_string(ids[1]) + ">");
}

TEST_F(GeneratorTest, ContextLimit) {
  GenerationRequest r;
  r.prompt = prompt_;
  r.sampling.temperature = 0;
  r.max_tokens = 100;
  r.context_limit = 12;
  std::string streamed;
  SessionState s = engine_->new_session();
  GenerationResult g = generate(*engine_, s, r, callbacks(&streamed));
  EXPECT_EQ(g.finish, FinishReason::kContextLimit);
  EXPECT_EQ(s.position, 12);
  EXPECT_EQ(g.tokens.size(), 5u);  // positions 8..11 fed, plus the token sampled from the last logits

  r.context_limit = 8;
  SessionState s2 = engine_->new_session();
  try {
    generate(*engine_, s2, r, callbacks(&streamed));
    FAIL() << "expected the too-long prompt to be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt has 8 tokens, which does not fit the context limit of 8"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(GeneratorTest, ReusesTheSessionPrefix) {
  GenerationRequest r;
  r.prompt = prompt_;
  r.sampling.temperature = 0;
  r.max_tokens = 3;
  std::string streamed;
  SessionState s = engine_->new_session();
  GenerationResult first = generate(*engine_, s, r, callbacks(&streamed));
  // Next turn: everything the session saw plus a few new tokens.
  GenerationRequest next = r;
  next.prompt = s.tokens;
  next.prompt.push_back(first.tokens.back());
  next.prompt.insert(next.prompt.end(), {499, 84, 101});
  GenerationResult second = generate(*engine_, s, next, callbacks(&streamed));
  EXPECT_EQ(second.stats.reused_tokens, static_cast<int64_t>(prompt_.size()) + 2);
  // Same tokens as a fresh session on the full prompt.
  SessionState fresh = engine_->new_session();
  GenerationResult again = generate(*engine_, fresh, next, callbacks(&streamed));
  EXPECT_EQ(again.stats.reused_tokens, 0);
  EXPECT_EQ(again.tokens, second.tokens);
}

TEST_F(GeneratorTest, CancelStopsPromptly) {
  std::atomic<bool> cancel{true};
  GenerationRequest r;
  r.prompt = prompt_;
  r.max_tokens = 50;
  std::string streamed;
  auto cb = callbacks(&streamed);
  cb.cancel = &cancel;
  SessionState s = engine_->new_session();
  GenerationResult g = generate(*engine_, s, r, cb);
  EXPECT_EQ(g.finish, FinishReason::kCancelled);
  EXPECT_TRUE(g.tokens.empty());
}

// Raises `flag` at its n-th acquire(): a Ctrl-C that lands inside a pass, in the middle of a
// layer's MoE, at a point a test can choose.
class RaiseAtAcquire final : public ExpertProvider {
 public:
  RaiseAtAcquire(std::unique_ptr<ExpertProvider> inner, std::atomic<bool>* flag) : inner_(std::move(inner)), flag_(flag) {}
  void arm(int64_t n) { left_ = n; }
  void prefetch(int layer, std::span<const int> experts) override { inner_->prefetch(layer, experts); }
  void predict(int layer, std::span<const int> experts) override { inner_->predict(layer, experts); }
  void expect(int layer, std::span<const int> experts) override { inner_->expect(layer, experts); }
  bool wants_predictions() const override { return inner_->wants_predictions(); }
  int64_t capacity() const override { return inner_->capacity(); }
  bool ready(int layer, int expert) const override { return inner_->ready(layer, expert); }
  const ExpertWeights& acquire(int layer, int expert) override {
    if (left_ > 0 && --left_ == 0) flag_->store(true);
    return inner_->acquire(layer, expert);
  }
  void release(int layer, int expert) override { inner_->release(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }

 private:
  std::unique_ptr<ExpertProvider> inner_;
  std::atomic<bool>* flag_;
  int64_t left_ = 0;
};

// Ctrl-C inside the one pass of a prefill (one chunk, at an expert of layer 0 or of the last
// layer) stops that pass: nothing of the prompt is kept, the session is rewound to where the
// generation started, and the same session then gives exactly the uncancelled answer. With
// every expert resident and with a two-slot streaming cache (reads abandoned mid-pass).
TEST_F(GeneratorTest, CancelInsideAPassRewindsTheSessionAndTheNextRunIsExact) {
  SessionState plain_session = engine_->new_session();
  std::string plain_text;
  const GenerationResult plain = generate(*engine_, plain_session, greedy_request(6), callbacks(&plain_text));
  // The acquires of the prompt's pass: the last but one is in the last layer's MoE.
  const uint64_t before = engine_->experts().stats().requests;
  SessionState counted = engine_->new_session();
  engine_->forward(counted, prompt_, nullptr, LogitRows::kLast);
  const auto pass_acquires = static_cast<int64_t>(engine_->experts().stats().requests - before);
  ASSERT_GT(pass_acquires, 4);
  for (bool streamed : {false, true}) {
    for (int64_t at : {int64_t{3}, pass_acquires - 1}) {
      SCOPED_TRACE((streamed ? "streamed, acquire " : "resident, acquire ") + std::to_string(at));
      auto ck = std::make_unique<const Checkpoint>(Checkpoint::open(test::fixture("tiny-a")));
      std::unique_ptr<ExpertProvider> inner;
      if (streamed) {
        ExpertStoreOptions so;
        so.slots = 2;
        so.direct_io = false;
        so.quiet = true;
        inner = std::make_unique<ExpertStore>(*ck, so);
      } else {
        inner = make_resident_experts(*ck);
      }
      std::atomic<bool> cancel{false};
      auto raising = std::make_unique<RaiseAtAcquire>(std::move(inner), &cancel);
      RaiseAtAcquire* raiser = raising.get();
      EngineOptions o;
      o.numerics = kernels::Numerics::kReference;
      std::unique_ptr<Engine> engine = Engine::create(std::move(ck), o, std::move(raising));

      SessionState s = engine->new_session();
      std::string text;
      GenerationCallbacks cb = callbacks(&text);
      cb.cancel = &cancel;
      raiser->arm(at);
      const GenerationResult cut = generate(*engine, s, greedy_request(6), cb);
      EXPECT_EQ(cut.finish, FinishReason::kCancelled);
      EXPECT_EQ(cut.stats.prefilled_tokens, 0);
      EXPECT_TRUE(cut.tokens.empty());
      EXPECT_TRUE(cancel.load());  // raised inside the pass, not before it
      test::expect_same_session(s, engine->new_session());

      cancel.store(false);
      text.clear();
      const GenerationResult again = generate(*engine, s, greedy_request(6), cb);
      EXPECT_EQ(again.tokens, plain.tokens);
      EXPECT_EQ(text, plain_text);
      test::expect_same_session(s, plain_session);
    }
  }
}

TEST_F(GeneratorTest, LogprobsAreLogSoftmaxOfTheModelsLogitsEvenUnderAFilter) {
  const int64_t V = engine_->config().vocab_size;
  // The logits at each step of a run that bans the greedy first token (so the filter matters).
  const std::vector<int32_t> greedy = greedy_ids(prompt_, 1);
  GenerationRequest r = greedy_request(5);
  r.top_logprobs = 3;
  r.logits_filter = [&](std::span<const int32_t> generated, std::span<float> logits) {
    if (generated.empty()) logits[greedy[0]] = -std::numeric_limits<float>::infinity();
  };
  std::string streamed;
  std::vector<TokenLogprob> seen;
  auto cb = callbacks(&streamed);
  cb.on_logprob = [&](const TokenLogprob& lp) { seen.push_back(lp); };
  SessionState s = engine_->new_session();
  GenerationResult g = generate(*engine_, s, r, cb);
  ASSERT_EQ(g.logprobs.size(), 5u);
  EXPECT_NE(g.tokens[0], greedy[0]);
  ASSERT_EQ(seen.size(), g.logprobs.size());

  // Teacher-forced logits of the same tokens, log-softmax in double.
  std::vector<int32_t> all = prompt_;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end() - 1);
  std::vector<float> logits(all.size() * static_cast<size_t>(V));
  SessionState t = engine_->new_session();
  engine_->forward(t, all, logits.data(), LogitRows::kAll);
  for (size_t i = 0; i < g.logprobs.size(); ++i) {
    const float* row = logits.data() + (prompt_.size() - 1 + i) * static_cast<size_t>(V);
    const double log_z = test::log_z(std::span<const float>(row, static_cast<size_t>(V)));
    const TokenLogprob& lp = g.logprobs[i];
    EXPECT_EQ(lp.token, g.tokens[i]);
    EXPECT_NEAR(lp.logprob, row[lp.token] - log_z, 1e-5) << "step " << i;
    EXPECT_EQ(seen[i].logprob, lp.logprob);
    ASSERT_EQ(lp.top.size(), 3u);
    for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(lp.top[k].second, row[lp.top[k].first] - log_z, 1e-5);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
    // The first step's top-1 is the banned greedy token: the filter does not change logprobs.
    if (i == 0) EXPECT_EQ(lp.top[0].first, greedy[0]);
    else EXPECT_EQ(lp.top[0].first, lp.token);  // greedy after the first step
  }
}

TEST_F(GeneratorTest, StopStringThatEndedItIsReported) {
  std::vector<int32_t> ids = greedy_ids(prompt_, 4);
  GenerationRequest r = greedy_request(20);
  const std::string late = "<" + std::to_string(ids[3]) + ">", early = "<" + std::to_string(ids[1]) + ">";
  r.stop_strings = {late, early};
  std::string streamed;
  SessionState s = engine_->new_session();
  GenerationResult g = generate(*engine_, s, r, callbacks(&streamed));
  EXPECT_EQ(g.finish, FinishReason::kStop);
  EXPECT_EQ(g.stop_string, early);
  EXPECT_TRUE(g.logprobs.empty());  // not requested
  r.stop_strings.clear();
  r.max_tokens = 2;
  SessionState s2 = engine_->new_session();
  EXPECT_EQ(generate(*engine_, s2, r, callbacks(&streamed)).stop_string, "");
}

}  // namespace
}  // namespace dsv4
