// Prefix reuse is exact (issue 46 item 2): on both numerics, with every expert resident and at
// --ram min (experts streamed), each kind of reuse (the identical prompt again, the same
// document with another question, a conversation carried on from the first prompt, two
// requests at once sharing the document, and after a restart with the disk tier) gives the
// tokens and log-probabilities (the chosen token's and the top 3, so the logits' softmax) of a
// server without a cache. (A turn that repeats the model's own answer resumes from the tokens
// the model generated, which need not be the answer text's canonical tokens: no cold run
// prefills those, so that case is checked in server_test.cc by its reuse, not here.)
#include <gtest/gtest.h>

#include <future>

#include "dsv4/runtime/model_loader.h"
#include "server_harness.h"

namespace dsv4::server::test_server {
namespace {

struct ReuseCase {
  kernels::Numerics numerics;
  const char* ram;
};

std::string case_name(const ::testing::TestParamInfo<ReuseCase>& info) {
  return std::string(info.param.numerics == kernels::Numerics::kReference ? "Reference" : "Fast") +
         (std::string(info.param.ram) == "min" ? "RamMin" : "Resident");
}

class ExactReuse : public ::testing::TestWithParam<ReuseCase> {};

Json ask(const std::string& doc, const std::string& question) {
  Json j = user_chat(doc + "\n\n" + question, 5);
  j["logprobs"] = true;
  j["top_logprobs"] = 3;
  return j;
}

// The first request carried on with an answer of the client's own and another question.
Json carried_on(const Json& first, const std::string& next) {
  Json j = first;
  j["messages"].push_back({{"role", "assistant"}, {"content", "Lamp 0, at dusk."}});
  j["messages"].push_back({{"role", "user"}, {"content", next}});
  return j;
}

int64_t cached(const Reply& r) { return r.json["usage"]["prompt_tokens_details"]["cached_tokens"]; }

TEST_P(ExactReuse, EveryKindOfReuseGivesAColdRunsTokensAndLogprobs) {
  LoadOptions lo;
  lo.ram = GetParam().ram;
  lo.engine.numerics = GetParam().numerics;
  lo.engine.threads = 1;
  lo.store.quiet = true;
  lo.workload.sessions = 2;
  LoadedEngine loaded = load_engine(test::fixture("tiny-a"), lo);
  Engine& engine = *loaded.engine;

  std::string doc;
  for (int i = 0; i < 24; ++i) doc += "Lamp " + std::to_string(i) + " was lit at dusk. ";
  const Json q1 = ask(doc, "Which lamp was first?"), q2 = ask(doc, "Which lamp was last?");

  ServerOptions cold_options = test_options();
  cold_options.scheduler.cache_entries = 0;
  std::map<std::string, Json> cold;
  {
    TestServer s(engine, cold_options);
    for (auto& [name, body] : std::vector<std::pair<std::string, Json>>{{"q1", q1}, {"q2", q2}}) {
      const Reply r = post(s, "/v1/chat/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      cold[name] = r.json;
    }
    const Reply r = post(s, "/v1/chat/completions", carried_on(q1, "And the next?"));
    ASSERT_EQ(r.status, 200) << r.body;
    cold["turn"] = r.json;
  }
  const Json turn = carried_on(q1, "And the next?");
  auto same_as_cold = [&](const Reply& r, const std::string& name) {
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json["choices"][0]["message"]["content"], cold[name]["choices"][0]["message"]["content"]) << name;
    EXPECT_EQ(r.json["choices"][0]["logprobs"], cold[name]["choices"][0]["logprobs"]) << name;
    EXPECT_EQ(r.json["usage"]["prompt_tokens"], cold[name]["usage"]["prompt_tokens"]) << name;
  };

  test::TempDir dir;
  ServerOptions o = test_options();
  o.scheduler.cache_block = 32;  // a multiple of tiny-a's compression ratios (4, 8)
  o.scheduler.cache_entries = 16;
  o.scheduler.parallel = 2;
  o.scheduler.cache_dir = dir / "cache";
  {
    TestServer s(engine, o);
    const Reply first = post(s, "/v1/chat/completions", q1);
    same_as_cold(first, "q1");
    EXPECT_EQ(cached(first), 0);
    const int64_t p1 = first.json["usage"]["prompt_tokens"];
    ASSERT_GT(p1, 200);
    const Reply again = post(s, "/v1/chat/completions", q1);  // identical: all but the last token
    same_as_cold(again, "q1");
    EXPECT_EQ(cached(again), p1 - 1);
    const Reply other = post(s, "/v1/chat/completions", q2);  // another question: every block before it
    same_as_cold(other, "q2");
    EXPECT_GE(cached(other), other.json["usage"]["prompt_tokens"].get<int64_t>() - 32 - 16);
    const Reply next = post(s, "/v1/chat/completions", turn);  // carried on: the whole first prompt but a token
    same_as_cold(next, "turn");
    EXPECT_EQ(cached(next), p1 - 1);
    // Two at once, through the same blocks, in two slots.
    auto a = std::async(std::launch::async, [&] { return post(s, "/v1/chat/completions", q1); });
    auto b = std::async(std::launch::async, [&] { return post(s, "/v1/chat/completions", q2); });
    same_as_cold(a.get(), "q1");
    same_as_cold(b.get(), "q2");
  }
  TestServer restarted(engine, o);  // from the disk tier
  const Reply again = post(restarted, "/v1/chat/completions", q1);
  same_as_cold(again, "q1");
  EXPECT_EQ(cached(again), again.json["usage"]["prompt_tokens"].get<int64_t>() - 1);
  // (q2 left no snapshot a token short of its end: it had under 64 tokens to prefill.)
  const Reply other = post(restarted, "/v1/chat/completions", q2);
  same_as_cold(other, "q2");
  EXPECT_GE(cached(other), other.json["usage"]["prompt_tokens"].get<int64_t>() - 32 - 16);
  const Reply next = post(restarted, "/v1/chat/completions", turn);
  same_as_cold(next, "turn");
  EXPECT_GE(cached(next), next.json["usage"]["prompt_tokens"].get<int64_t>() - 1 - 32);
}

INSTANTIATE_TEST_SUITE_P(NumericsAndBudget, ExactReuse,
                         ::testing::Values(ReuseCase{kernels::Numerics::kReference, "auto"},
                                           ReuseCase{kernels::Numerics::kReference, "min"},
                                           ReuseCase{kernels::Numerics::kFast, "auto"},
                                           ReuseCase{kernels::Numerics::kFast, "min"}),
                         case_name);

}  // namespace
}  // namespace dsv4::server::test_server
