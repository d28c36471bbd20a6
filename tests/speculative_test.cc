// Speculative decoding never changes the output: a pass's last rows taken back leave the
// session bit for bit as if they had never been fed, and generations with drafts (n-gram,
// auto, oracle drafts that are all right or often wrong) emit the same tokens, drawn from the
// same logits, as one-token-per-pass decoding — greedy and seeded sampling, every fixture,
// every expert resident and at --ram min.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>

#include "dsv4/model/engine.h"
#include "dsv4/model/undo_log.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/runtime/speculative.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::expect_same_session;
using test::pseudo_tokens;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- the undo log ------------------------------------------------------------------------

class UndoLogTest : public ::testing::TestWithParam<const char*> {};

// For prompts ending at every offset inside the compressor windows (ratios 4 and 8 on tiny-a,
// 4 and 128 on flashlike), a pass of 1..6 rows taken back to each possible length equals a
// session fed only the rows kept, field by field, and both continue with the same logits.
TEST_P(UndoLogTest, RewindGivesTheSessionThatNeverSawThoseRows) {
  EngineOptions eo;
  eo.numerics = kernels::Numerics::kReference;
  eo.threads = 2;
  auto engine = test::open_engine(test::fixture(GetParam()), eo);
  const int64_t V = engine->config().vocab_size;
  const std::vector<int32_t> text = pseudo_tokens(140, V, 7);
  std::vector<int64_t> prompt_lengths = {1, 2, 3, 5, 6, 7, 8, 9, 12, 15, 16};
  if (std::string(GetParam()) == "flashlike") prompt_lengths = {3, 122, 123, 124, 126, 127, 128};
  std::vector<float> a_logits(static_cast<size_t>(V)), b_logits(static_cast<size_t>(V));
  for (int64_t L : prompt_lengths) {
    SessionState base = engine->new_session();
    engine->forward(base, std::span<const int32_t>(text).first(static_cast<size_t>(L)), nullptr, LogitRows::kLast);
    for (int n = 1; n <= 6; ++n) {
      for (int keep = 0; keep <= n; ++keep) {
        SCOPED_TRACE(testing::Message() << GetParam() << " prompt " << L << " pass " << n << " keep " << keep);
        SessionState a = base;
        UndoLog undo;
        undo.begin(a);
        engine->forward(a, std::span<const int32_t>(text).subspan(static_cast<size_t>(L), static_cast<size_t>(n)),
                        nullptr, LogitRows::kLast, n, &undo);
        undo.rewind(a, L + keep);
        SessionState b = base;
        if (keep > 0)
          engine->forward(b, std::span<const int32_t>(text).subspan(static_cast<size_t>(L), static_cast<size_t>(keep)),
                          nullptr, LogitRows::kLast);
        expect_same_session(a, b);
        const auto more = std::span<const int32_t>(text).subspan(static_cast<size_t>(L + keep), 3);
        engine->forward(a, more, a_logits.data(), LogitRows::kLast, 1);
        engine->forward(b, more, b_logits.data(), LogitRows::kLast, 1);
        ASSERT_TRUE(same_bits(a_logits, b_logits));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, UndoLogTest, ::testing::Values("tiny-a", "flashlike"));

// ---- prompt lookup and the controller ---------------------------------------------------

TEST(NgramDraft, ContinuesTheMostRecentEarlierOccurrenceOfTheLongestSuffix) {
  int32_t out[8];
  const std::vector<int32_t> h = {5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7};
  // Suffix [6, 7]: most recent earlier occurrence at index 5 -> 9, 2, 6, 7.
  ASSERT_EQ(ngram_draft(h, 4, out), 4);
  EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{9, 2, 6, 7}));
  // A longer suffix wins: [1, 6, 7] ... [3, 1, 6, 7] -> the tokens after the first.
  const std::vector<int32_t> g = {3, 1, 6, 7, 4, 4, 6, 7, 5, 1, 6, 7};
  ASSERT_EQ(ngram_draft(g, 2, out), 2);
  EXPECT_EQ(out[0], 4);
  EXPECT_EQ(out[1], 4);
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{1, 2, 3}, 4, out), 0);
  EXPECT_EQ(ngram_draft(h, 0, out), 0);
}

TEST(DraftController, StopsDraftingWhenDraftsAreWrongAndProbesAgain) {
  DraftController c(4, /*may_stop_drafting=*/true);
  EXPECT_GT(c.draft_length(4), 0);  // optimistic before any measurement
  for (int i = 0; i < 40; ++i) {
    c.record(1, 0, 1.0);
    c.record(2, 0, 1.3);  // a 2-row pass costs 30 % more and its draft is always wrong
  }
  int drafted = 0;
  for (int i = 0; i < 4 * DraftController::kProbeInterval; ++i) drafted += c.draft_length(4) > 0;
  EXPECT_EQ(drafted, 4) << "one probe per interval";
  // Drafts that are always right and passes that cost little: draft all four.
  DraftController d(4, true);
  for (int i = 0; i < 40; ++i) d.record(5, 4, 1.1), d.record(1, 0, 1.0);
  EXPECT_EQ(d.draft_length(4), 4);
  EXPECT_EQ(d.draft_length(2), 2);
  // Pass times not measured yet come from the measured ones: drafting 2 at 1.2x the time of
  // one row and always right, a third draft (assumed ~1.3x) is worth trying.
  DraftController f(3, true);
  for (int i = 0; i < 40; ++i) f.record(3, 2, 0.24), f.record(1, 0, 0.2);
  EXPECT_EQ(f.draft_length(3), 3);
  // Probes whose drafts are wrong come ever more rarely: after 16, 32, 64, ... steps.
  DraftController g(2, true);
  for (int i = 0; i < 40; ++i) g.record(1, 0, 1.0), g.record(2, 0, 1.5);
  std::vector<int> probes;
  for (int step = 1; step <= 16 + 32 + 64 + 128; ++step) {
    const int k = g.draft_length(2);
    g.record(k + 1, 0, k ? 1.5 : 1.0);
    if (k) probes.push_back(step);
  }
  EXPECT_EQ(probes, (std::vector<int>{16, 48, 112, 240}));
  // A probe that is right brings drafting back.
  for (int i = 0; i < 512 && g.draft_length(2) == 0; ++i) g.record(1, 0, 1.0);
  g.record(2, 1, 1.05);
  for (int i = 0; i < 6; ++i) g.record(2, 1, 1.05);
  EXPECT_GT(g.draft_length(2), 0);
  // An explicit mode never stops.
  DraftController e(2, false);
  for (int i = 0; i < 40; ++i) e.record(2, 0, 5.0), e.record(1, 0, 1.0);
  EXPECT_EQ(e.draft_length(2), 1);
}

// ---- generations ---------------------------------------------------------------------------

struct Budget {
  const char* fixture;
  bool streamed;  // --ram min (the SSD expert store) vs every expert resident
};
void PrintTo(const Budget& b, std::ostream* os) { *os << b.fixture << (b.streamed ? " at --ram min" : " resident"); }

class SpeculativeGeneration : public ::testing::TestWithParam<Budget> {
 protected:
  void SetUp() override {
    LoadOptions o;
    o.engine.numerics = kernels::Numerics::kFast;
    o.engine.threads = 2;
    o.workload.context_tokens = 512;
    o.workload.chunk_tokens = 64;
    o.ram = GetParam().streamed ? "min" : "4G";
    o.mtp = MtpLoad::kYes;  // the MTP drafter, inside the budget (at --ram min too)
    loaded_ = load_engine(test::fixture(GetParam().fixture), o);
    ASSERT_TRUE(loaded_.engine->has_mtp());
    ASSERT_EQ(loaded_.plan.all_resident, !GetParam().streamed);
  }

  struct Run {
    GenerationResult result;
    std::vector<std::vector<float>> logits;  // what each token was drawn from
    SessionState session;
  };

  Run generate_with(const GenerationRequest& req) {
    Run run;
    run.session = loaded_.engine->new_session();
    GenerationCallbacks cb;
    cb.detokenize = [](int32_t) { return std::string(); };
    cb.on_logits = [&](std::span<const float> l) { run.logits.emplace_back(l.begin(), l.end()); };
    run.result = generate(*loaded_.engine, run.session, req, cb);
    return run;
  }

  void expect_same_run(const Run& a, const Run& b, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(a.result.tokens, b.result.tokens);
    EXPECT_EQ(a.result.finish, b.result.finish);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < a.logits.size(); ++i) ASSERT_TRUE(same_bits(a.logits[i], b.logits[i])) << "token " << i;
    // Log-probabilities come from the row of the pass that drew each token: the same numbers.
    ASSERT_EQ(a.result.logprobs.size(), b.result.logprobs.size());
    for (size_t i = 0; i < a.result.logprobs.size(); ++i) {
      const TokenLogprob &x = a.result.logprobs[i], &y = b.result.logprobs[i];
      EXPECT_EQ(x.token, y.token) << "token " << i;
      EXPECT_EQ(std::bit_cast<uint32_t>(x.logprob), std::bit_cast<uint32_t>(y.logprob)) << "token " << i;
      EXPECT_EQ(x.top, y.top) << "token " << i;
    }
    expect_same_session(a.session, b.session, loaded_.engine->config().num_layers);
  }

  LoadedEngine loaded_;
};

TEST_P(SpeculativeGeneration, EveryModeEmitsTheTokensAndLogitsOfPlainDecoding) {
  const int64_t V = loaded_.engine->config().vocab_size;
  // A random prompt, and one that repeats a phrase (so prompt lookup finds drafts).
  std::vector<int32_t> repetitive;
  const std::vector<int32_t> phrase = pseudo_tokens(9, V, 3);
  for (int i = 0; i < 6; ++i) repetitive.insert(repetitive.end(), phrase.begin(), phrase.end());
  const std::vector<std::vector<int32_t>> prompts = {pseudo_tokens(23, V, 11), repetitive};
  int64_t drafted = 0, accepted = 0, rejected_somewhere = 0;
  for (const auto& prompt : prompts) {
    for (const float temperature : {0.0f, 0.9f}) {
      GenerationRequest req;
      req.prompt = prompt;
      req.max_tokens = 40;
      req.sampling.temperature = temperature;
      req.sampling.top_p = temperature > 0 ? 0.95f : 1.0f;
      req.sampling.seed = 1234;
      req.stop_ids = {};  // run to max_tokens
      req.spec = SpecMode::kOff;
      req.top_logprobs = 2;
      const Run plain = generate_with(req);
      ASSERT_EQ(plain.result.tokens.size(), 40u);
      ASSERT_EQ(plain.result.logprobs.size(), 40u);
      EXPECT_EQ(plain.result.stats.drafted_tokens, 0);

      // Oracle drafts that are all right, and ones wrong at every third position.
      std::vector<int32_t> wrong = plain.result.tokens;
      for (size_t i = 2; i < wrong.size(); i += 3) wrong[i] = (wrong[i] + 1) % static_cast<int32_t>(V);
      struct Mode {
        SpecMode spec;
        int draft_max;
        const std::vector<int32_t>* oracle;
        const char* name;
      };
      const Mode modes[] = {{SpecMode::kNgram, 1, nullptr, "ngram k<=1"}, {SpecMode::kNgram, 4, nullptr, "ngram k<=4"},
                            {SpecMode::kMtp, 1, nullptr, "mtp k<=1"}, {SpecMode::kMtp, 3, nullptr, "mtp k<=3"},
                            {SpecMode::kAuto, 4, nullptr, "auto"},
                            {SpecMode::kOracle, 3, &plain.result.tokens, "oracle right"},
                            {SpecMode::kOracle, 5, &wrong, "oracle wrong every 3rd"}};
      for (const Mode& m : modes) {
        GenerationRequest r = req;
        r.spec = m.spec;
        r.draft_max = m.draft_max;
        if (m.oracle) r.oracle = *m.oracle;
        const Run run = generate_with(r);
        expect_same_run(plain, run, std::string(m.name) + (temperature > 0 ? " sampled" : " greedy"));
        drafted += run.result.stats.drafted_tokens;
        accepted += run.result.stats.accepted_tokens;
        rejected_somewhere += run.result.stats.accepted_tokens < run.result.stats.drafted_tokens;
        if (m.spec == SpecMode::kOracle && m.oracle == &plain.result.tokens) {
          EXPECT_EQ(run.result.stats.accepted_tokens, run.result.stats.drafted_tokens) << "an oracle is always right";
          EXPECT_GT(run.result.stats.tokens_per_pass(), 2.0);
        }
      }
    }
  }
  // The comparisons above covered real drafting: drafts kept and drafts taken back.
  EXPECT_GT(drafted, 100);
  EXPECT_GT(accepted, 50);
  EXPECT_GT(rejected_somewhere, 2);
}

INSTANTIATE_TEST_SUITE_P(Budgets, SpeculativeGeneration,
                         ::testing::Values(Budget{"tiny-a", false}, Budget{"tiny-a", true}, Budget{"flashlike", false},
                                           Budget{"flashlike", true}),
                         [](const auto& info) {
                           return std::string(info.param.fixture == std::string("tiny-a") ? "tiny_a" : "flashlike") +
                                  (info.param.streamed ? "_min" : "_resident");
                         });

// A context limit or a token budget inside a step's drafts: the step stops where plain
// decoding stops, with the same reason and the same session.
TEST_P(SpeculativeGeneration, LimitsInsideAStepStopWherePlainDecodingStops) {
  const int64_t V = loaded_.engine->config().vocab_size;
  for (const int64_t max_tokens : {1, 2, 3, 7}) {
    for (const int64_t context : {int64_t{0}, int64_t{30}}) {
      GenerationRequest req;
      req.prompt = pseudo_tokens(25, V, 5);
      req.max_tokens = max_tokens;
      req.context_limit = context;
      req.sampling.temperature = 0;
      Run plain = generate_with(req);
      GenerationRequest r = req;
      r.spec = SpecMode::kOracle;
      r.draft_max = 4;
      r.oracle = plain.result.tokens;
      r.oracle.resize(16, 2);
      expect_same_run(plain, generate_with(r), "max_tokens " + std::to_string(max_tokens) + " context " +
                                                   std::to_string(context));
    }
  }
}

}  // namespace
}  // namespace dsv4
