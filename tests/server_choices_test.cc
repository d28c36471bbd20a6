// OpenAI's `n`: the choices of one request are forked from one prefill of the prompt, and
// choice i is exactly (text, log-probabilities, finish) what a request with seed + i gives
// alone, streamed or not, on /v1/chat/completions and /v1/completions, with one slot or several.
#include <gtest/gtest.h>

#include <set>

#include "server_harness.h"

namespace dsv4::server::test_server {
namespace {

// What a choice is made of, without its index.
Json choice_body(const Json& choice) {
  Json c = choice;
  c.erase("index");
  return c;
}

Json sampled_chat(int seed, int n) {
  Json j = user_chat(kLighthouse, 10);
  j["temperature"] = 0.9;
  j["seed"] = seed;
  j["n"] = n;
  j["logprobs"] = true;
  j["top_logprobs"] = 2;
  return j;
}

// The choices of a stream, rebuilt per index: content and log-probability entries, the finish
// reason, and the stats of its last chunk.
struct StreamedChoice {
  std::string content;
  Json logprobs = Json::array();
  std::string finish;
  Json stats;
};
std::vector<StreamedChoice> streamed_choices(const std::string& body, size_t n, Json* usage) {
  std::vector<StreamedChoice> out(n);
  for (const Json& e : sse_events(body)) {
    if (!e.is_object()) continue;
    if (e["choices"].empty()) {
      *usage = e["usage"];
      continue;
    }
    EXPECT_EQ(e["choices"].size(), 1u);
    const Json& c = e["choices"][0];
    const size_t i = c["index"].get<size_t>();
    EXPECT_LT(i, n);
    if (i >= n) continue;
    if (c["delta"].contains("content")) out[i].content += c["delta"]["content"].get<std::string>();
    if (c["logprobs"].is_object())
      for (const Json& lp : c["logprobs"]["content"]) out[i].logprobs.push_back(lp);
    if (!c["finish_reason"].is_null()) {
      out[i].finish = c["finish_reason"];
      out[i].stats = e["stats"];
    }
  }
  return out;
}

void choices_equal_separate_requests(int parallel) {
  // The separate requests, on a server without a prefix cache: each prefills its whole prompt.
  std::vector<Json> alone;
  {
    ServerOptions o = test_options();
    o.scheduler.cache_entries = 0;
    TestServer s(o);
    for (int i = 0; i < 3; ++i) {
      const Reply a = post(s, "/v1/chat/completions", sampled_chat(41 + i, 1));
      ASSERT_EQ(a.status, 200) << a.body;
      alone.push_back(a.json);
    }
  }
  ServerOptions o = test_options();
  o.scheduler.parallel = parallel;
  o.scheduler.chunk = 4;
  TestServer s(o);
  // First, on an empty cache: the stream shows which choice prefilled.
  Json stream = sampled_chat(41, 3);
  stream["stream"] = true;
  stream["stream_options"] = {{"include_usage", true}};
  const Reply sr = post(s, "/v1/chat/completions", stream);
  ASSERT_EQ(sr.status, 200) << sr.body;
  Json stream_usage;
  const std::vector<StreamedChoice> streamed = streamed_choices(sr.body, 3, &stream_usage);

  const Reply r = post(s, "/v1/chat/completions", sampled_chat(41, 3));
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.json["choices"].size(), 3u);
  int64_t completion_tokens = 0;
  std::set<std::string> contents;
  for (int i = 0; i < 3; ++i) {
    const Json& c = r.json["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(choice_body(c), choice_body(alone[i]["choices"][0])) << "choice " << i;  // bit for bit
    EXPECT_EQ(r.json["usage"]["prompt_tokens"], alone[i]["usage"]["prompt_tokens"]);
    completion_tokens += alone[i]["usage"]["completion_tokens"].get<int64_t>();
    contents.insert(c["message"]["content"].get<std::string>());
    // Streamed, the same choice under the same index.
    EXPECT_EQ(streamed[i].content, c["message"]["content"]) << i;
    EXPECT_EQ(streamed[i].logprobs, c["logprobs"]["content"]) << i;
    EXPECT_EQ(streamed[i].finish, c["finish_reason"]) << i;
  }
  EXPECT_EQ(contents.size(), 3u);  // three seeds, three answers
  // Usage: the prompt once, the completions summed.
  EXPECT_EQ(r.json["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(r.json["usage"]["total_tokens"], r.json["usage"]["prompt_tokens"].get<int64_t>() + completion_tokens);
  EXPECT_EQ(stream_usage["prompt_tokens"], r.json["usage"]["prompt_tokens"]);
  EXPECT_EQ(stream_usage["completion_tokens"], completion_tokens);
  EXPECT_EQ(stream_usage["prompt_tokens_details"]["cached_tokens"], 0);
  // One prefill: the first choice prefilled the prompt, the others started from its snapshot
  // (all but the last token, which each feeds for its first logits).
  const int64_t prompt_tokens = r.json["usage"]["prompt_tokens"];
  EXPECT_EQ(streamed[0].stats["reused_tokens"], 0);
  EXPECT_EQ(streamed[1].stats["reused_tokens"], prompt_tokens - 1);
  EXPECT_EQ(streamed[2].stats["reused_tokens"], prompt_tokens - 1);
}

TEST(ServerChoices, EachChatChoiceIsWhatItsSeedGivesAlone) { choices_equal_separate_requests(1); }

// Two slots, three choices: two run side by side (sharing passes), the third queues.
TEST(ServerChoices, EachChatChoiceIsWhatItsSeedGivesAloneWithSlots) { choices_equal_separate_requests(2); }

TEST(ServerChoices, CompletionChoicesAndGreedyOnes) {
  TestServer s;
  Json body = {{"model", "tiny-a"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 1.0},
               {"seed", 7}, {"n", 2}, {"logprobs", 1}};
  const Reply r = post(s, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.json["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    Json one = body;
    one["n"] = 1;
    one["seed"] = 7 + i;
    const Reply alone = post(s, "/v1/completions", one);
    ASSERT_EQ(alone.status, 200);
    EXPECT_EQ(r.json["choices"][i]["index"], i);
    EXPECT_EQ(choice_body(r.json["choices"][i]), choice_body(alone.json["choices"][0])) << i;
  }
  // Streamed: every chunk names its choice.
  body["stream"] = true;
  const Reply sr = post(s, "/v1/completions", body);
  ASSERT_EQ(sr.status, 200);
  std::string text[2];
  for (const Json& e : sse_events(sr.body))
    if (e.is_object()) text[e["choices"][0]["index"].get<size_t>()] += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text[0], r.json["choices"][0]["text"]);
  EXPECT_EQ(text[1], r.json["choices"][1]["text"]);
  // Greedy choices are all the greedy answer.
  const Reply g = post(s, "/v1/chat/completions", [] {
    Json j = user_chat("Hi", 6);
    j["n"] = 2;
    return j;
  }());
  ASSERT_EQ(g.status, 200);
  EXPECT_EQ(g.json["choices"][0]["message"], g.json["choices"][1]["message"]);
}

TEST(ServerChoices, BadNIsA400NamingIt) {
  TestServer s;
  for (const Json& n : {Json(0), Json(17), Json(-1), Json("2"), Json(2.5)}) {
    Json body = user_chat("Hi", 2);
    body["n"] = n;
    const Reply r = post(s, "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << n;
    EXPECT_EQ(r.json["error"]["param"], "n") << r.body;
  }
  Json body = {{"model", "tiny-a"}, {"prompt", "x"}, {"n", 100}};
  const Reply r = post(s, "/v1/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.json["error"]["param"], "n");
  EXPECT_EQ(post(s, "/v1/chat/completions", user_chat("Hi", 2)).status, 200);  // still serving
}

// A client that goes away cancels every choice; the server goes on.
TEST(ServerChoices, DisconnectCancelsEveryChoice) {
  ServerOptions o = test_options();
  o.scheduler.parallel = 2;
  TestServer s(o);
  {
    RawConnection c(s.port());
    Json body = endless(true);
    body["n"] = 3;
    c.send_request("/v1/chat/completions", body.dump());
    c.read_until("data: ");
    ASSERT_TRUE(wait_until([&] { return s.server().scheduler().gauges().running_count == 2; }, 10s));
  }
  EXPECT_TRUE(wait_until(
      [&] {
        const SchedulerGauges g = s.server().scheduler().gauges();
        return g.running_count == 0 && g.queue_depth == 0;
      },
      10s));
  EXPECT_EQ(post(s, "/v1/chat/completions", user_chat("Hi", 2)).status, 200);
}

}  // namespace
}  // namespace dsv4::server::test_server
