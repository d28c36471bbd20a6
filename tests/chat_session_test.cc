// Cancelling a turn leaves the conversation exactly as it was: the session mark/rewind gives
// back the state bit for bit, and a chat whose turn is interrupted mid-prefill continues
// token for token like a chat in which that turn was never typed.
#include <gtest/gtest.h>

#include <atomic>

#include "dsv4/model/engine.h"
#include "dsv4/runtime/chat_session.h"
#include "dsv4/runtime/session_mark.h"
#include "dsv4/text/tokenizer.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::expect_same_session;

class ChatSessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.numerics = kernels::Numerics::kReference;
    o.threads = 1;
    engine_ = test::open_engine(test::fixture("tiny-a"), o).release();
    tokenizer_ = new text::Tokenizer(text::Tokenizer::from_file(test::fixture("tiny-a") + "/tokenizer.json"));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete tokenizer_;
  }
  GenerationRequest request(int max_tokens = 6) const {
    GenerationRequest r;
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.stop_ids = {static_cast<int32_t>(engine_->config().eos_token_id)};
    r.chunk = 16;
    return r;
  }
  GenerationCallbacks callbacks(std::atomic<bool>* cancel = nullptr, int64_t cancel_after = -1) const {
    GenerationCallbacks cb;
    cb.detokenize = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
    cb.cancel = cancel;
    if (cancel)
      cb.on_prefill_progress = [cancel, cancel_after](int64_t done, int64_t) {
        if (done >= cancel_after) cancel->store(true);
      };
    return cb;
  }
  static std::string long_message() {
    std::string s;
    for (int i = 0; i < 40; ++i) s += "The lighthouse keeper counted the ships again, one by one. ";
    return s;
  }
  static Engine* engine_;
  static text::Tokenizer* tokenizer_;
};
Engine* ChatSessionTest::engine_ = nullptr;
text::Tokenizer* ChatSessionTest::tokenizer_ = nullptr;

TEST_F(ChatSessionTest, RewindGivesBackTheMarkedStateBitForBit) {
  std::vector<int32_t> head, more;
  for (int i = 0; i < 37; ++i) head.push_back(100 + (i * 7) % 300);
  for (int i = 0; i < 90; ++i) more.push_back(50 + (i * 11) % 400);
  std::vector<float> a(engine_->config().vocab_size), b(a.size());
  SessionState s = engine_->new_session();
  engine_->forward(s, head, nullptr, LogitRows::kLast);
  const SessionMark m = mark_session(s);
  engine_->forward(s, more, nullptr, LogitRows::kLast, 16);  // past several compressor windows and the sliding window
  rewind_session(s, m);
  SessionState fresh = engine_->new_session();
  engine_->forward(fresh, head, nullptr, LogitRows::kLast);
  expect_same_session(s, fresh);
  // And it goes on the same way.
  engine_->forward(s, more, a.data(), LogitRows::kLast);
  engine_->forward(fresh, more, b.data(), LogitRows::kLast);
  EXPECT_EQ(a, b);
  // A fresh session's mark rewinds to a fresh session.
  SessionState empty = engine_->new_session();
  const SessionMark zero = mark_session(empty);
  engine_->forward(empty, head, nullptr, LogitRows::kLast);
  rewind_session(empty, zero);
  expect_same_session(empty, engine_->new_session());
}

TEST_F(ChatSessionTest, AnInterruptedPrefillLeavesTheConversationAsItWas) {
  const text::chat::EncodeOptions eo;
  // Uninterrupted: two turns.
  ChatSession plain(*engine_, *tokenizer_);
  plain.reset("You are terse.");
  const ChatSession::Turn p1 = plain.turn("Hello there.", eo, request(), callbacks());
  const ChatSession::Turn p2 = plain.turn("How are you?", eo, request(), callbacks());
  ASSERT_TRUE(p1.kept && p2.kept);

  // The same, with a long turn in between that Ctrl-C stops during its prefill.
  ChatSession chat(*engine_, *tokenizer_);
  chat.reset("You are terse.");
  const ChatSession::Turn c1 = chat.turn("Hello there.", eo, request(), callbacks());
  EXPECT_EQ(c1.result.tokens, p1.result.tokens);
  const SessionState before = chat.session();
  std::atomic<bool> cancel{false};
  const ChatSession::Turn cut = chat.turn(long_message(), eo, request(), callbacks(&cancel, 16));
  EXPECT_FALSE(cut.kept);
  EXPECT_EQ(cut.result.finish, FinishReason::kCancelled);
  EXPECT_EQ(cut.result.stats.prefilled_tokens, 16);
  EXPECT_GT(cut.result.stats.prompt_tokens - cut.result.stats.reused_tokens, 200);
  EXPECT_EQ(cut.result.stats.generated_tokens, 0);
  EXPECT_GT(cut.result.stats.peak_rss_bytes, 0u);
  expect_same_session(chat.session(), before);
  EXPECT_EQ(chat.turns(), 1);

  // The next turn's prompt is the full history, token for token, and so is its answer.
  const ChatSession::Turn c3 = chat.turn("How are you?", eo, request(), callbacks());
  EXPECT_EQ(c3.prompt, p2.prompt);
  EXPECT_EQ(c3.result.tokens, p2.result.tokens);
  EXPECT_EQ(c3.result.stats.reused_tokens, p2.result.stats.reused_tokens);
  expect_same_session(chat.session(), plain.session());
}

TEST_F(ChatSessionTest, AnInterruptedFirstTurnAndAnInterruptedAnswerAreForgotten) {
  const text::chat::EncodeOptions eo;
  ChatSession plain(*engine_, *tokenizer_);
  plain.reset("You are terse.");
  const ChatSession::Turn p1 = plain.turn("Hello there.", eo, request(), callbacks());

  ChatSession chat(*engine_, *tokenizer_);
  chat.reset("You are terse.");
  std::atomic<bool> cancel{false};
  EXPECT_FALSE(chat.turn(long_message(), eo, request(), callbacks(&cancel, 16)).kept);
  EXPECT_EQ(chat.session().position, 0);
  // Stopped during the answer: also forgotten.
  std::atomic<bool> stop_answer{false};
  GenerationCallbacks cb = callbacks();
  int seen = 0;
  cb.detokenize = [&](int32_t id) {
    if (++seen == 3) stop_answer = true;
    return "<" + std::to_string(id) + ">";
  };
  cb.cancel = &stop_answer;
  const ChatSession::Turn cut = chat.turn("Tell me more.", eo, request(50), cb);
  EXPECT_FALSE(cut.kept);
  EXPECT_EQ(cut.result.tokens.size(), 3u);
  EXPECT_EQ(chat.session().position, 0);
  const ChatSession::Turn c = chat.turn("Hello there.", eo, request(), callbacks());
  EXPECT_EQ(c.prompt, p1.prompt);
  EXPECT_EQ(c.result.tokens, p1.result.tokens);
  expect_same_session(chat.session(), plain.session());
}

}  // namespace
}  // namespace dsv4
