// The MTP drafter (Engine::mtp_draft, model/mtp.cc). Its logits along a sequence match the
// trainer's torch MTP (demo_model_torch_vs_engine); here: a draft made at any point of a
// session, whatever passes fed it and however long ago the MTP last ran, is the greedy pick
// of those logits; chained drafts leave the session exactly as before; and loading the
// drafter never changes what the main model computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "dsv4/model/engine.h"
#include "dsv4/runtime/model_loader.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::pseudo_tokens;

int32_t argmax(const float* v, int64_t n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

std::unique_ptr<Engine> mtp_engine(const std::string& dir, int64_t max_rows = 512) {
  EngineOptions eo;
  eo.numerics = kernels::Numerics::kReference;
  eo.threads = 2;
  eo.mtp = true;
  eo.max_rows = max_rows;
  eo.context = 1024;
  return test::open_engine(dir, eo);
}

class MtpTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir() const { return std::string(GetParam()) == "demo" ? "models/demo" : test::fixture(GetParam()); }
};

// A draft after feeding the first m tokens (next = tokens[m]) is the argmax of MTP row m - 1,
// for m on both sides of the window (128) and for sessions fed in one pass, in odd chunks, or
// token by token with drafts in between.
TEST_P(MtpTest, EachDraftIsTheGreedyPickOfTheMtpLogitsAtThatPosition) {
  auto engine = mtp_engine(dir());
  ASSERT_TRUE(engine->has_mtp());
  const int64_t V = engine->config().vocab_size;
  const std::vector<int32_t> text = pseudo_tokens(300, V, 3);
  std::vector<float> mtp(static_cast<size_t>(text.size() - 1) * V);
  engine->mtp_score(text, mtp.data());
  auto want = [&](int64_t m) { return argmax(mtp.data() + (m - 1) * V, V); };

  for (int64_t m : {1, 2, 5, 127, 128, 129, 200, 299}) {
    SCOPED_TRACE(testing::Message() << GetParam() << " after " << m << " tokens");
    SessionState s = engine->new_session();
    engine->forward(s, std::span<const int32_t>(text).first(static_cast<size_t>(m)), nullptr, LogitRows::kLast);
    int32_t draft = -1;
    ASSERT_EQ(engine->mtp_draft(s, text[static_cast<size_t>(m)], 1, &draft), 1);
    EXPECT_EQ(draft, want(m));
    // In chunks of 37 with a draft after every chunk (the MTP catches up a chunk at a time).
    SessionState c = engine->new_session();
    for (int64_t b = 0; b < m; b += 37) {
      const int64_t n = std::min<int64_t>(37, m - b);
      engine->forward(c, std::span<const int32_t>(text).subspan(static_cast<size_t>(b), static_cast<size_t>(n)),
                      nullptr, LogitRows::kLast);
      ASSERT_EQ(engine->mtp_draft(c, text[static_cast<size_t>(b + n)], 1, &draft), 1);
      EXPECT_EQ(draft, want(b + n));
    }
  }
  // Token by token, a draft at every step.
  SessionState t = engine->new_session();
  for (int64_t m = 1; m <= 160; ++m) {
    engine->forward(t, std::span<const int32_t>(&text[static_cast<size_t>(m - 1)], 1), nullptr, LogitRows::kLast);
    int32_t draft = -1;
    ASSERT_EQ(engine->mtp_draft(t, text[static_cast<size_t>(m)], 1, &draft), 1);
    ASSERT_EQ(draft, want(m)) << "token by token, after " << m;
  }
}

// Chained drafts run the MTP past the session's end and take those rows back: the session
// is unchanged (every field), the same call gives the same drafts, and the first draft is
// the one-draft answer.
TEST_P(MtpTest, ChainedDraftsLeaveTheSessionAsItWas) {
  auto engine = mtp_engine(dir());
  const int64_t V = engine->config().vocab_size;
  const std::vector<int32_t> text = pseudo_tokens(200, V, 5);
  for (int64_t m : {3, 126, 150}) {
    SessionState s = engine->new_session();
    engine->forward(s, std::span<const int32_t>(text).first(static_cast<size_t>(m)), nullptr, LogitRows::kLast);
    int32_t one = -1;
    engine->mtp_draft(s, text[static_cast<size_t>(m)], 1, &one);
    const SessionState before = s;
    int32_t a[6] = {}, b[6] = {};
    ASSERT_EQ(engine->mtp_draft(s, text[static_cast<size_t>(m)], 6, a), 6);
    test::expect_same_session(s, before);
    EXPECT_EQ(a[0], one);
    ASSERT_EQ(engine->mtp_draft(s, text[static_cast<size_t>(m)], 6, b), 6);
    EXPECT_TRUE(std::equal(a, a + 6, b)) << "after " << m;
  }
}

// The main model's logits do not depend on whether the drafter is loaded, and a workspace of
// fewer rows than the window (MTP passes split) gives the same drafts.
TEST_P(MtpTest, LoadingTheDrafterChangesNothingElse) {
  EngineOptions eo;
  eo.numerics = kernels::Numerics::kReference;
  eo.threads = 2;
  eo.context = 1024;
  auto plain = test::open_engine(dir(), eo);
  auto with = mtp_engine(dir());
  auto narrow = mtp_engine(dir(), 16);
  EXPECT_FALSE(plain->has_mtp());
  const int64_t V = plain->config().vocab_size;
  const std::vector<int32_t> text = pseudo_tokens(180, V, 9);
  std::vector<float> a(text.size() * V), b(text.size() * V);
  SessionState sa = plain->new_session(), sb = with->new_session();
  plain->forward(sa, text, a.data(), LogitRows::kAll);
  with->forward(sb, text, b.data(), LogitRows::kAll);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  int32_t none = -1;
  EXPECT_EQ(plain->mtp_draft(sa, text[0], 2, &none), 0);

  SessionState sn = narrow->new_session();
  narrow->forward(sn, text, nullptr, LogitRows::kLast);
  int32_t wide_drafts[3], narrow_drafts[3];
  ASSERT_EQ(with->mtp_draft(sb, 7, 3, wide_drafts), 3);
  ASSERT_EQ(narrow->mtp_draft(sn, 7, 3, narrow_drafts), 3);
  EXPECT_TRUE(std::equal(wide_drafts, wide_drafts + 3, narrow_drafts));
}

INSTANTIATE_TEST_SUITE_P(Models, MtpTest, ::testing::Values("tiny-a", "flashlike", "demo"));

// The planner counts the drafter inside the budget.
TEST(MtpPlan, TheDrafterIsInsideTheBudget) {
  const Checkpoint ck = Checkpoint::open("models/demo");
  LoadOptions o;
  o.ram = "8G";
  o.mtp = MtpLoad::kYes;
  const MemoryPlan with = plan_for(ck, o);
  o.mtp = MtpLoad::kNo;
  const MemoryPlan without = plan_for(ck, o);
  EXPECT_GT(with.mtp_bytes, 3u << 20);  // mtp.0 of the demo model: 3.9 MB
  EXPECT_EQ(without.mtp_bytes, 0u);
  EXPECT_GT(with.projected_peak(), without.projected_peak() + with.mtp_bytes - 1);
  o.ram = "min";
  o.mtp = MtpLoad::kYes;
  const MemoryPlan at_min = plan_for(ck, o);
  EXPECT_EQ(at_min.mtp_bytes, with.mtp_bytes);
  EXPECT_GE(at_min.minimum_budget, without.minimum_budget + with.mtp_bytes);
}

}  // namespace
}  // namespace dsv4
