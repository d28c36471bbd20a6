// The OpenAI-compatible server's parts as units (src/dsv4/server/): the answer splitter
// (reasoning / content / tool calls) that streaming and non-streaming responses share, request
// validation, the prefix cache and metrics. server_test.cc runs the HTTP server itself.
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dsv4/server/chat_output.h"
#include "dsv4/server/metrics.h"
#include "dsv4/server/openai_api.h"
#include "dsv4/server/prefix_cache.h"
#include "dsv4/server/token_trie.h"
#include "dsv4/text/dsml.h"
#include "dsv4/util/error.h"
#include "test_util.h"

namespace dsv4::server {
namespace {

namespace chat = text::chat;


const std::string kThinkEnd(chat::kThinkEnd);
const std::string kDsml(chat::kDsml);

std::string tool_block(const std::string& name, const std::string& params) {
  return "\n\n<" + kDsml + "tool_calls>\n<" + kDsml + "invoke name=\"" + name + "\">\n" + params + "\n</" + kDsml +
         "invoke>\n</" + kDsml + "tool_calls>";
}
std::string string_param(const std::string& name, const std::string& value) {
  return "<" + kDsml + "parameter name=\"" + name + "\" string=\"true\">" + value + "</" + kDsml + "parameter>";
}

// Feeds `text` in pieces of `step` bytes and collects everything the parser returns.
ChatDelta feed_in_pieces(ChatOutputParser& p, const std::string& text, size_t step, std::vector<ChatDelta>* deltas = nullptr) {
  ChatDelta all;
  auto add = [&](ChatDelta d) {
    if (deltas) deltas->push_back(d);
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(c);
  };
  for (size_t i = 0; i < text.size(); i += step) add(p.feed(text.substr(i, step)));
  add(p.finish());
  return all;
}

// ---- the answer splitter ---------------------------------------------------------------------

TEST(ChatOutput, PlainContentComesOutWhateverThePieces) {
  const std::string text = "Hello, world.\n\nA second paragraph\n";
  for (size_t step : {1, 2, 5, 100}) {
    ChatOutputParser p(false, true, "call_");
    ChatDelta d = feed_in_pieces(p, text, step);
    EXPECT_EQ(d.content, text) << step;
    EXPECT_TRUE(d.reasoning.empty());
    EXPECT_TRUE(d.tool_calls.empty());
  }
}

TEST(ChatOutput, ThinkingSplitsAtThinkEndEvenWhenTheMarkerIsSplit) {
  const std::string text = "Let me think <about> it." + kThinkEnd + "The answer is 4.";
  for (size_t step : {1, 3, 7, 1000}) {
    ChatOutputParser p(true, false, "call_");
    std::vector<ChatDelta> deltas;
    ChatDelta d = feed_in_pieces(p, text, step, &deltas);
    EXPECT_EQ(d.reasoning, "Let me think <about> it.") << step;
    EXPECT_EQ(d.content, "The answer is 4.") << step;
    for (const ChatDelta& x : deltas) {
      EXPECT_EQ(x.reasoning.find('/'), std::string::npos) << "a piece of </think> leaked into the reasoning";
      EXPECT_EQ(x.content.find("think>"), std::string::npos);
    }
  }
}

TEST(ChatOutput, UnclosedThinkingIsAllReasoning) {
  ChatOutputParser p(true, false, "call_");
  ChatDelta d = feed_in_pieces(p, "still thinking </thi", 4);
  EXPECT_EQ(d.reasoning, "still thinking </thi");
  EXPECT_EQ(d.content, "");
}

TEST(ChatOutput, ToolCallsAreParsedAndNeverStreamedAsContent) {
  const std::string text = "Checking." + tool_block("get_weather", string_param("location", "Beijing"));
  for (size_t step : {1, 4, 9, 1000}) {
    ChatOutputParser p(false, true, "call_x_");
    std::vector<ChatDelta> deltas;
    ChatDelta d = feed_in_pieces(p, text, step, &deltas);
    EXPECT_EQ(d.content, "Checking.") << step;
    ASSERT_EQ(d.tool_calls.size(), 1u) << step;
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"location": "Beijing"})");
    EXPECT_EQ(d.tool_calls[0].id, "call_x_0");
    for (const ChatDelta& x : deltas) EXPECT_EQ(x.content.find(kDsml), std::string::npos);
  }
}

TEST(ChatOutput, ThinkingThenTwoToolCalls) {
  const std::string text = "I need two lookups." + kThinkEnd +
                           "\n\n<" + kDsml + "tool_calls>\n<" + kDsml + "invoke name=\"a\">\n" + string_param("q", "1") +
                           "\n</" + kDsml + "invoke>\n<" + kDsml + "invoke name=\"b\">\n<" + kDsml +
                           "parameter name=\"n\" string=\"false\">3</" + kDsml + "parameter>\n</" + kDsml + "invoke>\n</" +
                           kDsml + "tool_calls>";
  ChatOutputParser p(true, true, "call_");
  ChatDelta d = feed_in_pieces(p, text, 5);
  EXPECT_EQ(d.reasoning, "I need two lookups.");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[1].name, "b");
  EXPECT_EQ(d.tool_calls[1].arguments, R"({"n": 3})");
  EXPECT_EQ(d.tool_calls[1].id, "call_1");
}

TEST(ChatOutput, MalformedOrUnofferedToolBlocksStayContent) {
  const std::string broken = "x" + std::string("\n\n<") + kDsml + "tool_calls>\n<" + kDsml + "invoke name=\"a\">\noops";
  ChatOutputParser p(false, true, "call_");
  ChatDelta d = feed_in_pieces(p, broken, 3);
  EXPECT_EQ(d.content, broken);
  EXPECT_TRUE(d.tool_calls.empty());

  const std::string trailing = "y" + tool_block("a", string_param("q", "1")) + "and more";
  ChatOutputParser p2(false, true, "call_");
  EXPECT_EQ(feed_in_pieces(p2, trailing, 2).content, trailing);

  const std::string valid = "z" + tool_block("a", string_param("q", "1"));
  ChatOutputParser p3(false, false, "call_");  // no tools offered: nothing is parsed
  ChatDelta d3 = feed_in_pieces(p3, valid, 1);
  EXPECT_EQ(d3.content, valid);
  EXPECT_TRUE(d3.tool_calls.empty());
}

// An answer cut anywhere inside a tool-call block (max_tokens) is never markup in the content:
// the calls whose name was written come back, each complete one as a whole answer gives it,
// the cut one with arguments that are a prefix of its whole arguments text.
TEST(ChatOutput, ACutToolCallIsACallWithTheArgumentsWrittenSoFar) {
  const std::string block = "\n\n<" + kDsml + "tool_calls>\n<" + kDsml + "invoke name=\"get_weather\">\n" +
                            string_param("city", "Par\"is é") + "\n<" + kDsml +
                            "parameter name=\"days\" string=\"false\">[12, 3]</" + kDsml + "parameter>\n</" + kDsml +
                            "invoke>\n<" + kDsml + "invoke name=\"b\">\n" + string_param("q", "x<y") + "\n</" + kDsml +
                            "invoke>\n</" + kDsml + "tool_calls>";
  const std::string text = "Let me check." + block;
  ChatOutputParser whole_parser(false, true, "call_");
  const ChatDelta whole = feed_in_pieces(whole_parser, text, 1000);
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_EQ(whole.tool_calls[0].arguments, R"({"city": "Par\"is é", "days": [12, 3]})");
  size_t cuts = 0, with_cut_call = 0;
  for (size_t len = std::string("Let me check.").size() + 1; len < text.size(); ++len) {
    if ((static_cast<unsigned char>(text[len]) & 0xC0) == 0x80) continue;  // text comes in whole characters
    bool in_token = false;  // ｜DSML｜ is one token
    for (size_t at = text.find(kDsml); at != std::string::npos; at = text.find(kDsml, at + 1))
      in_token = in_token || (at < len && len < at + kDsml.size());
    if (in_token) continue;
    ++cuts;
    const std::string cut = text.substr(0, len);
    ChatOutputParser p(false, true, "call_");
    ChatDelta d = p.feed(cut);
    const ChatDelta rest = p.finish(true);
    d.content += rest.content;
    EXPECT_EQ(d.content.find(kDsml), std::string::npos) << cut;
    // Before the ｜DSML｜ token, "\n\n<" could still be text.
    const std::string before = cut.substr(13, 3);
    EXPECT_EQ(d.content, "Let me check." + (len <= 16 ? before : "")) << cut;
    ASSERT_LE(rest.tool_calls.size(), 2u) << cut;
    for (size_t i = 0; i < rest.tool_calls.size(); ++i) {
      const chat::ToolCall& c = rest.tool_calls[i];
      EXPECT_EQ(c.name, whole.tool_calls[i].name) << cut;
      EXPECT_EQ(c.id, "call_" + std::to_string(i));
      const bool last_cut = rest.cut_call && i + 1 == rest.tool_calls.size();
      if (last_cut) EXPECT_TRUE(whole.tool_calls[i].arguments.starts_with(c.arguments)) << cut << "\n" << c.arguments;
      else EXPECT_EQ(c.arguments, whole.tool_calls[i].arguments) << cut;
    }
    if (rest.cut_call) {
      ++with_cut_call;
      ASSERT_TRUE(rest.cut_input.is_object()) << cut;
      // The input so far: every value whole except a cut string's (a prefix of it).
      const Json full = Json::parse(whole.tool_calls[rest.tool_calls.size() - 1].arguments);
      for (const auto& [key, value] : rest.cut_input.items()) {
        ASSERT_TRUE(full.contains(key)) << cut;
        if (value.is_string()) EXPECT_TRUE(full[key].get<std::string>().starts_with(value.get<std::string>())) << cut;
        else EXPECT_EQ(value, full[key]) << cut;
      }
    }
  }
  EXPECT_GT(with_cut_call, cuts / 2);
  // A cut inside the first call's name has no call yet; just after it, the call with "{".
  const std::string named = "\n\n<" + kDsml + "tool_calls>\n<" + kDsml + "invoke name=\"get_wea";
  ChatOutputParser p1(false, true, "call_");
  p1.feed(named);
  ChatDelta r1 = p1.finish(true);
  EXPECT_TRUE(r1.tool_calls.empty());
  EXPECT_EQ(r1.content, "");
  ChatOutputParser p2(false, true, "call_");
  p2.feed(named + "ther\">\n");
  ChatDelta r2 = p2.finish(true);
  ASSERT_EQ(r2.tool_calls.size(), 1u);
  EXPECT_EQ(r2.tool_calls[0].arguments, "{");
  EXPECT_TRUE(r2.cut_call);
  // Not cut (the answer ended on its own): the same text is a malformed block, kept as content.
  ChatOutputParser p3(false, true, "call_");
  p3.feed(named + "ther\">\n");
  EXPECT_EQ(p3.finish(false).content, named + "ther\">\n");
  // A complete block is the same whether or not the answer was cut after it.
  ChatOutputParser p4(false, true, "call_");
  p4.feed(block);
  ChatDelta r4 = p4.finish(true);
  EXPECT_FALSE(r4.cut_call);
  EXPECT_EQ(r4.tool_calls.size(), 2u);
}

TEST(ChatOutput, ResponseJsonCarriesToolCallsAndFinishReason) {
  ChatOutputParser p(false, true, "call_abc_");
  ChatDelta body = p.feed(tool_block("lookup", string_param("q", "cats")));
  ChatDelta end = p.finish();
  ChatAnswer a{body.reasoning + end.reasoning, body.content + end.content, end.tool_calls};
  GenerationStats s;
  s.prompt_tokens = 10;
  s.generated_tokens = 5;
  s.reused_tokens = 4;
  Json j = chat_completion_json(
      {"chatcmpl-1", 7, "m"},
      Json::array({chat_choice_json(0, a, false, finish_reason_text(FinishReason::kStop, true))}), usage_json(s),
      stats_json(s, 0));
  const Json& msg = j["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_abc_0");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "lookup");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"q": "cats"})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["usage"]["total_tokens"], 15);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

// ---- request parsing -------------------------------------------------------------------------

RequestDefaults defaults() {
  RequestDefaults d;
  d.max_tokens = 16;
  d.vocab_size = 512;
  return d;
}

Json chat_body(Json messages) { return Json{{"model", "m"}, {"messages", std::move(messages)}}; }

TEST(ApiRequestParsing, ChatEncodesWithTheOfficialFormat) {
  Json body = chat_body(Json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}));
  ApiRequest r = parse_chat_request(body, defaults());
  const std::string B(chat::kBos), U(chat::kUser), A(chat::kAssistant);
  EXPECT_EQ(r.prompt_text, B + "Be brief." + U + "Hi" + A + kThinkEnd);
  EXPECT_EQ(r.history_bytes, (B + "Be brief.").size());
  EXPECT_FALSE(r.thinking);
  EXPECT_EQ(r.max_tokens, 16);

  body["reasoning_effort"] = "max";
  r = parse_chat_request(body, defaults());
  EXPECT_TRUE(r.thinking);
  EXPECT_NE(r.prompt_text.find("Reasoning Effort: Absolute maximum"), std::string::npos);
  EXPECT_TRUE(r.prompt_text.ends_with(A + std::string(chat::kThinkStart)));
  body["chat_template_kwargs"] = {{"thinking", false}};
  EXPECT_FALSE(parse_chat_request(body, defaults()).thinking);
  body.erase("chat_template_kwargs");
  body["thinking"] = {{"type", "disabled"}};
  EXPECT_FALSE(parse_chat_request(body, defaults()).thinking);
}

TEST(ApiRequestParsing, ToolsGoOnTheSystemMessageUnlessToolChoiceIsNone) {
  Json tools = Json::array({{{"type", "function"},
                             {"function", {{"name", "get_weather"}, {"description", "d"}, {"parameters", {{"type", "object"}}}}}}});
  Json body = chat_body(Json::array({{{"role", "user"}, {"content", "Weather?"}}}));
  body["tools"] = tools;
  ApiRequest r = parse_chat_request(body, defaults());
  EXPECT_TRUE(r.tools);
  Json expected_messages = chat::attach_tools(body["messages"], tools);
  EXPECT_EQ(r.prompt_text, chat::encode_messages(expected_messages, {}));
  EXPECT_NE(r.prompt_text.find("## Tools"), std::string::npos);
  body["tool_choice"] = "none";
  r = parse_chat_request(body, defaults());
  EXPECT_FALSE(r.tools);
  EXPECT_EQ(r.prompt_text.find("## Tools"), std::string::npos);
}

TEST(ApiRequestParsing, AssistantToolCallsAndToolResultsEncodeLikeTheEncoder) {
  Json messages = Json::array(
      {{{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", Json::array({{{"id", "call_1"}, {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", R"({"temp": 21})"}}});
  ApiRequest r = parse_chat_request(chat_body(messages), defaults());
  Json for_encoder = messages;
  for_encoder[1]["content"] = "";
  EXPECT_EQ(r.prompt_text, chat::encode_messages(for_encoder, {}));
  EXPECT_NE(r.prompt_text.find("<tool_result>{\"temp\": 21}</tool_result>"), std::string::npos);
  EXPECT_NE(r.prompt_text.find("invoke name=\"get_weather\""), std::string::npos);
}

// Reasoning sent back in earlier assistant turns: dropped before the last user turn in thinking
// mode (official golden 2), kept when tools are present (golden 1), never shown in chat mode.
TEST(ApiRequestParsing, EarlierReasoningIsTreatedAsTheOfficialEncodingSays) {
  const std::string data = "tests/data/dsv4_encoding/";
  const std::string opening = std::string(chat::kAssistant) + std::string(chat::kThinkStart);
  auto golden_prefix = [&](const std::string& file) {
    const std::string text = test::read_file(data + file);
    return text.substr(0, text.rfind(opening) + opening.size());
  };
  // The goldens spell the field "reasoning"; clients send reasoning_content (both are accepted).
  auto as_sent = [](Json messages, const char* field) {
    messages.erase(messages.size() - 1);
    for (Json& m : messages)
      if (m.contains("reasoning")) {
        Json r = m["reasoning"];
        m.erase("reasoning");
        m[field] = r;
      }
    return messages;
  };
  for (const char* field : {"reasoning_content", "reasoning"}) {
    Json body = chat_body(as_sent(Json::parse(test::read_file(data + "test_input_2.json")), field));
    body["reasoning_effort"] = "high";
    EXPECT_EQ(parse_chat_request(body, defaults()).prompt_text, golden_prefix("test_output_2.txt")) << field;
    body.erase("reasoning_effort");
    const std::string chat_mode = parse_chat_request(body, defaults()).prompt_text;
    EXPECT_EQ(chat_mode.find("greet back"), std::string::npos) << chat_mode;

    const Json golden = Json::parse(test::read_file(data + "test_input_1.json"));
    Json with_tools = chat_body(as_sent(golden["messages"], field));
    with_tools["tools"] = golden["tools"];
    with_tools["reasoning_effort"] = "high";
    const std::string prompt = parse_chat_request(with_tools, defaults()).prompt_text;
    EXPECT_EQ(prompt, golden_prefix("test_output_1.txt")) << field;
    EXPECT_NE(prompt.find("I should use the get_weather tool."), std::string::npos);
  }
}

TEST(ApiRequestParsing, SamplingStopAndDefaults) {
  RequestDefaults d = defaults();
  d.stop = {"END"};
  d.seed = 42;
  Json body = chat_body(Json::array({{{"role", "user"}, {"content", "x"}}}));
  ApiRequest r = parse_chat_request(body, d);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.seed, 42u);
  body.update(Json{{"temperature", 0.5}, {"top_p", 0.9}, {"seed", -1}, {"stop", "x"}, {"max_completion_tokens", 7},
                   {"top_k", 5}, {"ignore_eos", true}});
  r = parse_chat_request(body, d);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.seed, ~uint64_t{0});
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(ApiRequestParsing, CompletionPrompts) {
  Json body = {{"model", "m"}, {"prompt", "Once"}};
  ApiRequest r = parse_completion_request(body, defaults());
  EXPECT_EQ(r.prompt_text, std::string(chat::kBos) + "Once");
  body["prompt"] = Json::array({1, 2, 3});
  r = parse_completion_request(body, defaults());
  EXPECT_TRUE(r.prompt_text.empty());
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  body["prompt"] = Json::array({Json::array({4, 5})});
  EXPECT_EQ(parse_completion_request(body, defaults()).prompt_ids, (std::vector<int32_t>{4, 5}));
}

TEST(ApiRequestParsing, ErrorsNameTheField) {
  auto param_of = [](const Json& body) {
    try {
      parse_chat_request(body, defaults());
    } catch (const ApiException& e) {
      EXPECT_EQ(e.error().status, 400);
      EXPECT_NE(e.error().message.find(e.error().param), std::string::npos) << e.error().message;
      return e.error().param;
    }
    return std::string("(accepted)");
  };
  Json ok = chat_body(Json::array({{{"role", "user"}, {"content", "x"}}}));
  EXPECT_EQ(param_of(ok), "(accepted)");
  Json b = ok;
  b["messages"][0]["role"] = "wizard";
  EXPECT_EQ(param_of(b), "messages[0].role");
  b = ok;
  b["messages"][0]["content"] = Json::array({{{"type", "image_url"}}});
  EXPECT_EQ(param_of(b), "messages[0].content[0].type");
  b = ok;
  b["max_tokens"] = -3;
  EXPECT_EQ(param_of(b), "max_tokens");
  b = ok;
  b["tools"] = Json::array({{{"type", "function"}, {"function", {{"name", "bad name"}}}}});
  EXPECT_EQ(param_of(b), "tools[0].function.name");
}

// Two functions of one name are refused (as the Anthropic API refuses two tools of one name):
// 400 naming the second one's name and the name itself.
TEST(ApiRequestParsing, DuplicateFunctionNamesAreRefused) {
  auto fn = [](const std::string& name) {
    return Json{{"type", "function"}, {"function", {{"name", name}, {"parameters", {{"type", "object"}}}}}};
  };
  Json b = chat_body(Json::array({{{"role", "user"}, {"content", "x"}}}));
  b["tools"] = Json::array({fn("get_weather"), fn("other")});
  EXPECT_NO_THROW(parse_chat_request(b, defaults()));
  b["tools"].push_back(fn("get_weather"));
  try {
    parse_chat_request(b, defaults());
    ADD_FAILURE() << "duplicate function names were accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_EQ(e.error().param, "tools[2].function.name");
    EXPECT_NE(e.error().message.find("tools[2].function.name"), std::string::npos) << e.error().message;
    EXPECT_NE(e.error().message.find("\"get_weather\" is given twice"), std::string::npos) << e.error().message;
  }
}

TEST(ApiRequestParsing, BodyGuards) {
  auto code_of = [](std::string_view body) {
    try {
      parse_json_body(body);
    } catch (const ApiException& e) {
      return e.error().code;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(code_of(R"({"a": [1, {"b": "c"}]})"), "(accepted)");
  EXPECT_EQ(code_of("{\"a\": \"\xff\"}"), "invalid_utf8");
  EXPECT_EQ(code_of(std::string(100000, '[')), "invalid_json");
  EXPECT_EQ(code_of("{\"a\":" + std::string(60, '[') + std::string(60, ']') + "}"), "(accepted)");
  EXPECT_EQ(code_of("{\"a\":" + std::string(70, '[') + std::string(70, ']') + "}"), "invalid_json");
  EXPECT_EQ(code_of("[1]"), "invalid_json");  // not an object
  EXPECT_EQ(code_of("{\"a\": 1} x"), "invalid_json");
  EXPECT_EQ(code_of(""), "invalid_json");
  // Brackets inside strings do not count as nesting.
  EXPECT_EQ(code_of("{\"a\": \"" + std::string(1000, '[') + "\"}"), "(accepted)");
}

// ---- prefix cache and metrics ----------------------------------------------------------------

SessionState session_with(std::vector<int32_t> tokens, size_t payload_floats = 0) {
  SessionState s;
  s.tokens = std::move(tokens);
  s.position = static_cast<int64_t>(s.tokens.size());
  s.layers.resize(1);
  s.layers[0].window_kv.assign(payload_floats, 1.0f);
  return s;
}

// The radix index against a brute-force scan: random keys over a 3-token alphabet (so paths
// share, split and merge often), inserted and erased in random order, some keys twice; every
// lookup finds exactly the keys that are prefixes of the query, shortest first, and the
// longest common prefix with any key.
TEST(TokenTrie, AgreesWithAScanThroughInsertsAndErases) {
  std::mt19937 rng(46);
  std::vector<std::vector<int32_t>> keys(300);
  for (auto& k : keys) {
    k.resize(rng() % 12);
    for (int32_t& t : k) t = static_cast<int32_t>(rng() % 3);
  }
  std::vector<int> values(keys.size());
  server::TokenTrie<int> trie;
  std::vector<bool> in(keys.size(), false);
  for (int step = 0; step < 3000; ++step) {
    const size_t i = rng() % keys.size();
    if (in[i])
      trie.erase(keys[i], &values[i]);
    else
      trie.insert(keys[i], &values[i]);
    in[i] = !in[i];
    std::vector<int32_t> query(rng() % 14);
    for (int32_t& t : query) t = static_cast<int32_t>(rng() % 3);
    std::vector<std::pair<size_t, int*>> found, want;
    trie.prefixes_of(query, [&](size_t depth, int* v) { found.emplace_back(depth, v); });
    size_t shared = 0;
    for (size_t k = 0; k < keys.size(); ++k) {
      if (!in[k]) continue;
      const auto& key = keys[k];
      const size_t n = std::min(key.size(), query.size());
      const size_t common = static_cast<size_t>(std::mismatch(key.begin(), key.begin() + static_cast<ptrdiff_t>(n), query.begin()).first - key.begin());
      shared = std::max(shared, common);
      if (common == key.size()) want.emplace_back(key.size(), &values[k]);
    }
    for (size_t f = 1; f < found.size(); ++f) ASSERT_LE(found[f - 1].first, found[f].first) << "shortest first";
    std::sort(found.begin(), found.end());
    std::sort(want.begin(), want.end());
    ASSERT_EQ(found, want) << "step " << step;
    ASSERT_EQ(trie.shared_prefix(query), shared) << "step " << step;
  }
}

TEST(PrefixCache, LongestPrefixByKeyIncludingTheUnfedTail) {
  PrefixCache cache(4, 1 << 20);
  cache.insert(session_with({1, 2}), {}, "");
  cache.insert(session_with({1, 2, 3}), std::vector<int32_t>{4}, "");  // key 1 2 3 4
  cache.insert(session_with({9}), {}, "");
  auto m = cache.longest_token_prefix(std::vector<int32_t>{1, 2, 3, 4, 5});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->state.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(m->key, (std::vector<int32_t>{1, 2, 3, 4}));
  // A key equal to the prompt is still usable: its session is one token short.
  m = cache.longest_token_prefix(std::vector<int32_t>{1, 2, 3, 4});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->state.tokens.size(), 3u);
  // A session that holds the whole prompt is not (one token must be fed to get logits).
  m = cache.longest_token_prefix(std::vector<int32_t>{1, 2});
  EXPECT_FALSE(m);
  EXPECT_FALSE(cache.longest_token_prefix(std::vector<int32_t>{7, 1, 2, 3}));
}

TEST(PrefixCache, EvictsLeastRecentlyUsedByCountAndBytes) {
  PrefixCache cache(2, 1 << 20);
  cache.insert(session_with({1}), {}, "");
  cache.insert(session_with({2}), {}, "");
  ASSERT_TRUE(cache.longest_token_prefix(std::vector<int32_t>{1, 5}));  // 1 is now the most recent
  cache.insert(session_with({3}), {}, "");
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_TRUE(cache.longest_token_prefix(std::vector<int32_t>{1, 5}));
  EXPECT_FALSE(cache.longest_token_prefix(std::vector<int32_t>{2, 5}));

  PrefixCache small(8, 100000);  // bytes bound: ~40 KB sessions, two fit
  for (int32_t t = 1; t <= 4; ++t) small.insert(session_with({t}, 10000), {}, "");
  EXPECT_EQ(small.entries(), 2u);
  EXPECT_LE(small.bytes(), 100000u);
  small.insert(session_with({5}, 100000), {}, "");  // larger than the bound: not kept
  EXPECT_EQ(small.entries(), 2u);
  EXPECT_FALSE(small.longest_token_prefix(std::vector<int32_t>{5, 1}));
}

// Eviction weighs the prefill a snapshot saves per byte against its age (GreedyDual-Size): a
// 1,000-token snapshot outlives more recent 1-token ones of the same size, until enough
// newer ones have come and gone (each eviction raises the clock to the victim's priority).
TEST(PrefixCache, ASnapshotThatSavesMorePrefillOutlivesNewerOnesForAWhile) {
  std::vector<int32_t> long_tokens(1000);
  for (size_t i = 0; i < long_tokens.size(); ++i) long_tokens[i] = static_cast<int32_t>(10 + i);
  std::vector<int32_t> longer = long_tokens;
  longer.push_back(7);
  // Bytes bound: ~40 KB sessions, two fit. The long one, then `newer` 1-token ones.
  auto after = [&](int newer) {
    auto cache = std::make_unique<PrefixCache>(64, 100000);
    cache->insert(session_with(long_tokens, 10000), {}, "");
    for (int32_t t = 1; t <= newer; ++t) cache->insert(session_with({-t}, 10000), {}, "");
    EXPECT_EQ(cache->entries(), 2u);
    return cache;
  };
  auto cache = after(2);  // over the bound: the older 1-token one goes
  EXPECT_FALSE(cache->longest_token_prefix(std::vector<int32_t>{-1, 5}));
  EXPECT_TRUE(cache->longest_token_prefix(std::vector<int32_t>{-2, 5}));
  EXPECT_TRUE(cache->longest_token_prefix(longer));
  EXPECT_TRUE(after(100)->longest_token_prefix(longer));
  // Recency still counts: the stream of newer snapshots wears its lead away.
  EXPECT_FALSE(after(3000)->longest_token_prefix(longer));
}

TEST(PrefixCache, TextPrefixNeedsTheJunctionCheck) {
  PrefixCache cache(4, 1 << 20);
  cache.insert(session_with({1, 2}), {}, "Hello");
  cache.insert(session_with({1, 2, 3}), {}, "Hello wor");
  auto always = [](std::string_view) { return true; };
  auto never_w = [](std::string_view rest) { return !rest.starts_with("ld"); };
  auto m = cache.longest_text_prefix("Hello world", always);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->text, "Hello wor");
  m = cache.longest_text_prefix("Hello world", never_w);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->text, "Hello");
  EXPECT_FALSE(cache.longest_text_prefix("Hello", always));  // must be a proper prefix
}

TEST(Metrics, PrometheusTextWithCumulativeHistograms) {
  Metrics m;
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 200);
  m.count_request("other", 404);
  GenerationStats s;
  s.prompt_tokens = 10;
  s.reused_tokens = 3;
  s.generated_tokens = 5;
  s.decode_s = 1.0;
  m.observe_generation(s, 0.3, 0.01, FinishReason::kLength);
  ExpertStats e;
  e.requests = 10;
  e.hits = 8;
  e.bytes_read = 12345;
  m.set_expert_stats(e);
  const std::string text = m.render({3, true, 2, 4096});
  EXPECT_NE(text.find("dsv4_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_requests_total{endpoint=\"other\",status=\"404\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_prompt_tokens_total 10\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_prompt_tokens_reused_total 3\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_generated_tokens_total 5\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_time_to_first_token_seconds_bucket{le=\"0.25\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_time_to_first_token_seconds_bucket{le=\"0.5\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_decode_tokens_per_second_bucket{le=\"4\"} 1\n"), std::string::npos);  // 4 tok/s
  EXPECT_NE(text.find("dsv4_expert_hit_rate 0.8\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_expert_bytes_read_total 12345\n"), std::string::npos);
  EXPECT_NE(text.find("dsv4_queue_depth 3\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE dsv4_time_to_first_token_seconds histogram\n"), std::string::npos);
}
}  // namespace
}  // namespace dsv4::server
