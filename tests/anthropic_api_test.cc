// The Anthropic Messages API format (src/dsv4/server/anthropic_api.*) as units: requests in
// Anthropic's shape encode to the official DeepSeek-V4 goldens, tool_choice and thinking rules,
// errors that name the field, Anthropic's error shape, and the stream events, which must add up
// to the same content blocks as the non-streaming message.
#include <gtest/gtest.h>

#include <limits>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/server/anthropic_api.h"
#include "dsv4/server/chat_output.h"
#include "dsv4/text/chat_format.h"
#include "test_util.h"

namespace dsv4::server::anthropic {
namespace {

namespace chat = text::chat;
const std::string kDataDir = "tests/data/dsv4_encoding/";
const std::string B(chat::kBos), U(chat::kUser), A(chat::kAssistant), E(chat::kEos);
const std::string kThinkStart(chat::kThinkStart), kThinkEnd(chat::kThinkEnd), kDsml(chat::kDsml);

Json load(const std::string& name) { return Json::parse(test::read_file(kDataDir + name)); }

RequestDefaults defaults() {
  RequestDefaults d;
  d.max_tokens = 16;
  d.vocab_size = 1000;
  return d;
}

Json body(Json messages) { return Json{{"model", "claude-x"}, {"max_tokens", 64}, {"messages", std::move(messages)}}; }
Json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// The official golden's conversation in Anthropic's shape: system at the top level, tools with
// input_schema, the assistant's reasoning as thinking blocks, its calls as tool_use blocks with
// an input object, results as tool_result blocks of a user message.
Json anthropic_from_golden(const Json& golden_messages, const Json& golden_tools) {
  Json out = {{"model", "claude-x"}, {"max_tokens", 4096}, {"messages", Json::array()}};
  for (const Json& m : golden_messages) {
    const std::string role = m["role"];
    if (role == "system") {
      out["system"] = Json::array({{{"type", "text"}, {"text", m["content"]}, {"cache_control", {{"type", "ephemeral"}}}}});
    } else if (role == "user") {
      out["messages"].push_back({{"role", "user"}, {"content", Json::array({{{"type", "text"}, {"text", m["content"]}}})}});
    } else if (role == "tool") {
      out["messages"].push_back(
          {{"role", "user"},
           {"content", Json::array({{{"type", "tool_result"}, {"tool_use_id", m["tool_call_id"]}, {"content", m["content"]}}})}});
    } else {
      Json blocks = Json::array();
      if (m.contains("reasoning")) blocks.push_back({{"type", "thinking"}, {"thinking", m["reasoning"]}, {"signature", "sig"}});
      if (m.contains("content")) blocks.push_back({{"type", "text"}, {"text", m["content"]}});
      if (m.contains("tool_calls"))
        for (const Json& c : m["tool_calls"])
          blocks.push_back({{"type", "tool_use"},
                            {"id", c["id"]},
                            {"name", c["function"]["name"]},
                            {"input", Json::parse(c["function"]["arguments"].get<std::string>())}});
      out["messages"].push_back({{"role", "assistant"}, {"content", blocks}});
    }
  }
  if (!golden_tools.is_null()) {
    out["tools"] = Json::array();
    for (const Json& t : golden_tools)
      out["tools"].push_back({{"name", t["function"]["name"]},
                              {"description", t["function"]["description"]},
                              {"input_schema", t["function"]["parameters"]}});
  }
  return out;
}

// The golden prompt up to where the model writes the last assistant turn.
std::string golden_prompt_before_last_answer(const std::string& file, const std::string& opening) {
  const std::string text = test::read_file(kDataDir + file);
  return text.substr(0, text.rfind(opening) + opening.size());
}

TEST(AnthropicRequest, ToolConversationEncodesAsTheOfficialGolden) {
  const Json golden = load("test_input_1.json");
  Json messages = golden["messages"];
  messages.erase(messages.size() - 1);  // the model is to write the last assistant turn
  Json b = anthropic_from_golden(messages, golden["tools"]);
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 2048}};
  const ApiRequest r = parse_messages_request(b, defaults());
  EXPECT_EQ(r.prompt_text, golden_prompt_before_last_answer("test_output_1.txt", A + kThinkStart));
  EXPECT_TRUE(r.thinking);
  EXPECT_TRUE(r.tools);
  EXPECT_FALSE(r.no_tool_calls);
  EXPECT_EQ(r.thinking_budget, 2048);
  EXPECT_EQ(r.max_tokens, 4096);
  EXPECT_EQ(r.kind, ApiKind::kMessages);
  // The history boundary: before the last user turn (the tool result).
  EXPECT_EQ(r.prompt_text.substr(r.history_bytes, U.size()), U);
  EXPECT_NE(r.prompt_text.substr(r.history_bytes).find("<tool_result>"), std::string::npos);
}

TEST(AnthropicRequest, EarlierThinkingIsDroppedAsTheOfficialEncodingSays) {
  Json messages = load("test_input_2.json");
  messages.erase(messages.size() - 1);
  Json b = anthropic_from_golden(messages, nullptr);
  b["thinking"] = {{"type", "adaptive"}};
  const ApiRequest r = parse_messages_request(b, defaults());
  EXPECT_EQ(r.prompt_text, golden_prompt_before_last_answer("test_output_2.txt", A + kThinkStart));
  EXPECT_EQ(r.prompt_text.find("I should greet back"), std::string::npos);  // dropped, as in the golden
  EXPECT_EQ(r.thinking_budget, 0);
}

TEST(AnthropicRequest, StringContentSystemStringAndChatMode) {
  Json b = body(Json::array({user("Hi")}));
  b["system"] = "Be brief.";
  ApiRequest r = parse_messages_request(b, defaults());
  EXPECT_EQ(r.prompt_text, B + "Be brief." + U + "Hi" + A + kThinkEnd);
  EXPECT_FALSE(r.thinking);
  EXPECT_EQ(r.history_bytes, (B + "Be brief.").size());
  // Several text blocks of one user message are one turn, joined as the official blocks are.
  b["messages"][0]["content"] = Json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}});
  EXPECT_EQ(parse_messages_request(b, defaults()).prompt_text, B + "Be brief." + U + "a\n\nb" + A + kThinkEnd);
}

TEST(AnthropicRequest, ToolResultsWithSeveralBlocksAreJoinedAsTheOfficialEncoderDoes) {
  Json b = body(Json::array({user("Take a screenshot."),
                             {{"role", "assistant"},
                              {"content", Json::array({{{"type", "tool_use"}, {"id", "t1"}, {"name", "shot"}, {"input", Json::object()}}})}},
                             {{"role", "user"},
                              {"content", Json::array({{{"type", "tool_result"},
                                                        {"tool_use_id", "t1"},
                                                        {"is_error", false},
                                                        {"content", Json::array({{{"type", "text"}, {"text", "taken"}},
                                                                                 {{"type", "image"}, {"source", Json::object()}}})}},
                                                       {{"type", "text"}, {"text", "What do you see?"}}})}}}));
  const std::string prompt = parse_messages_request(b, defaults()).prompt_text;
  EXPECT_NE(prompt.find(U + "<tool_result>taken\n\n[Unsupported image]</tool_result>\n\nWhat do you see?" + A), std::string::npos)
      << prompt;
}

TEST(AnthropicRequest, ALastAssistantMessageIsAPrefillTheAnswerContinues) {
  Json b = body(Json::array({user("Name a color."), {{"role", "assistant"}, {"content", "The color is"}}}));
  ApiRequest r = parse_messages_request(b, defaults());
  EXPECT_EQ(r.prompt_text, B + U + "Name a color." + A + kThinkEnd + "The color is");
  EXPECT_FALSE(r.thinking);
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  b["max_tokens"] = 2000;
  r = parse_messages_request(b, defaults());
  EXPECT_EQ(r.prompt_text, B + U + "Name a color." + A + kThinkStart + kThinkEnd + "The color is");
  EXPECT_FALSE(r.thinking);  // the prefill closed the reasoning
  EXPECT_EQ(r.thinking_budget, 0);
}

Json weather_tool() {
  return {{"name", "get_weather"},
          {"description", "Weather of a city"},
          {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
}

TEST(AnthropicRequest, ToolChoiceNoneKeepsTheToolsButBansCalls) {
  Json b = body(Json::array({user("Weather?")}));
  b["tools"] = Json::array({weather_tool()});
  const ApiRequest with_tools = parse_messages_request(b, defaults());
  EXPECT_TRUE(with_tools.tools);
  EXPECT_NE(with_tools.prompt_text.find("## Tools"), std::string::npos);
  EXPECT_NE(with_tools.prompt_text.find(R"({"name": "get_weather", "description": "Weather of a city", "parameters": )"),
            std::string::npos)
      << with_tools.prompt_text;
  b["tool_choice"] = {{"type", "none"}};
  const ApiRequest none = parse_messages_request(b, defaults());
  EXPECT_EQ(none.prompt_text, with_tools.prompt_text);  // same prefix: the cache still matches
  EXPECT_FALSE(none.tools);
  EXPECT_TRUE(none.no_tool_calls);
  EXPECT_EQ(none.tool_choice.mode, ToolChoice::Mode::kNone);
}

TEST(AnthropicRequest, ForcedToolChoiceConstrainsTheAnswerToTheToolsInputSchemas) {
  Json b = body(Json::array({user("Weather in Paris?")}));
  Json ping = {{"name", "ping"}, {"input_schema", {{"type", "object"}}}};
  b["tools"] = Json::array({ping, weather_tool()});
  const ApiRequest with_auto = parse_messages_request(b, defaults());
  EXPECT_FALSE(with_auto.output.active());
  EXPECT_EQ(with_auto.stop, defaults().stop);

  b["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}};
  ApiRequest r = parse_messages_request(b, defaults());
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::kTool);
  EXPECT_FALSE(r.tool_choice.parallel);
  EXPECT_TRUE(r.tools);
  EXPECT_EQ(r.prompt_text, with_auto.prompt_text);  // nothing forced into the prompt
  ASSERT_TRUE(r.output.active());
  EXPECT_TRUE(r.output.calls_required);
  EXPECT_FALSE(r.output.content_schema);
  ASSERT_EQ(r.output.tools.size(), 1u);  // that tool alone, once
  EXPECT_EQ(r.output.tools[0].name, "get_weather");
  EXPECT_EQ(r.output.tools[0].parameters, weather_tool()["input_schema"]);
  EXPECT_EQ(r.output.tools[0].param, "tools[1].input_schema");
  EXPECT_EQ(r.output.max_calls, 1u);
  EXPECT_TRUE(r.stop.empty());  // a default stop string could cut the input short
  const constrain::AnswerFormat f = answer_format(r.output, r.thinking);
  EXPECT_TRUE(f.calls_required);
  EXPECT_NO_THROW(constrain::build_answer_grammar(f));

  b["tool_choice"] = {{"type", "any"}};
  r = parse_messages_request(b, defaults());
  ASSERT_EQ(r.output.tools.size(), 2u);  // any tool, in parallel
  EXPECT_EQ(r.output.tools[0].name, "ping");
  EXPECT_EQ(r.output.tools[0].param, "tools[0].input_schema");
  EXPECT_EQ(r.output.max_calls, kMaxParallelToolCalls);
  b["tool_choice"]["disable_parallel_tool_use"] = true;
  EXPECT_EQ(parse_messages_request(b, defaults()).output.max_calls, 1u);

  // A schema outside the subset is refused naming the keyword's path in the request.
  b["tools"][1]["input_schema"]["properties"]["city"]["not"] = {{"pattern", "x"}};
  try {
    constrain::build_answer_grammar(answer_format(parse_messages_request(b, defaults()).output, false));
    ADD_FAILURE() << "accepted";
  } catch (const constrain::SchemaError& e) {
    EXPECT_EQ(e.param(), "tools[1].input_schema.properties.city.not");
  }
}

std::string param_of(const Json& b, bool count_tokens = false) {
  try {
    parse_messages_request(b, defaults(), {}, count_tokens);
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_NE(e.error().message.find(e.error().param), std::string::npos) << e.error().message;
    return e.error().param;
  }
  return "(accepted)";
}

TEST(AnthropicRequest, ErrorsNameTheField) {
  const Json ok = body(Json::array({user("x")}));
  EXPECT_EQ(param_of(ok), "(accepted)");
  Json b = ok;
  b.erase("max_tokens");
  EXPECT_EQ(param_of(b), "max_tokens");
  EXPECT_EQ(param_of(b, true), "(accepted)");  // count_tokens needs no max_tokens
  b = ok;
  b.erase("model");
  EXPECT_EQ(param_of(b), "model");
  b = ok;
  b["messages"][0]["role"] = "system";
  EXPECT_EQ(param_of(b), "messages[0].role");
  b = ok;
  b["messages"][0]["content"] = Json::array({{{"type", "image"}, {"source", Json::object()}}});
  EXPECT_EQ(param_of(b), "messages[0].content[0].type");
  b = ok;
  b["messages"][0]["content"] = Json::array({{{"type", "tool_result"}}});
  EXPECT_EQ(param_of(b), "messages[0].content[0].tool_use_id");
  b = ok;
  b["messages"].push_back({{"role", "assistant"}, {"content", Json::array({{{"type", "tool_use"}, {"id", "t"}, {"name", "f"}}})}});
  b["messages"].push_back(user("y"));
  EXPECT_EQ(param_of(b), "messages[1].content[0].input");
  b = ok;
  b["temperature"] = 1.5;  // Anthropic's range is [0, 1]
  EXPECT_EQ(param_of(b), "temperature");
  b = ok;
  b["stop_sequences"] = Json::array({"a", ""});
  EXPECT_EQ(param_of(b), "stop_sequences[1]");
  b = ok;
  b["tools"] = Json::array({weather_tool(), weather_tool()});
  EXPECT_EQ(param_of(b), "tools[1].name");
  b = ok;
  b["tools"] = Json::array({{{"type", "web_search_20250305"}, {"name", "web_search"}}});
  EXPECT_EQ(param_of(b), "tools[0].type");
  b = ok;
  b["tools"] = Json::array({{{"name", "f"}}});
  EXPECT_EQ(param_of(b), "tools[0].input_schema");
  b = ok;
  b["tool_choice"] = {{"type", "any"}};
  EXPECT_EQ(param_of(b), "tool_choice");  // no tools to call
  b["tools"] = Json::array({weather_tool()});
  b["tool_choice"] = {{"type", "tool"}, {"name", "nope"}};
  EXPECT_EQ(param_of(b), "tool_choice.name");
  b["tool_choice"] = {{"type", "sometimes"}};
  EXPECT_EQ(param_of(b), "tool_choice.type");
  b["tool_choice"] = {{"type", "any"}};
  b["stop_sequences"] = Json::array({"x"});
  EXPECT_EQ(param_of(b), "stop_sequences");  // could cut a forced input short
  b["stop_sequences"] = Json::array();
  EXPECT_EQ(param_of(b), "(accepted)");
  b["max_tokens"] = 4096;
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  EXPECT_EQ(param_of(b), "tool_choice");  // forced tool use needs thinking off, as Anthropic's API
  b = ok;
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 100}};
  EXPECT_EQ(param_of(b), "thinking.budget_tokens");  // below 1024
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 2048}};
  EXPECT_EQ(param_of(b), "thinking.budget_tokens");  // not below max_tokens (64)
  b["thinking"] = {{"type", "enabled"}};
  EXPECT_EQ(param_of(b), "thinking.budget_tokens");
  b = ok;
  b["system"] = Json::array({{{"type", "image"}}});
  EXPECT_EQ(param_of(b), "system[0].type");
  b = ok;
  b["messages"] = Json::array();
  EXPECT_EQ(param_of(b), "messages");
}

// tool_use ids are checked across the whole conversation: each non-empty and unique, and a
// tool_result answers an earlier tool_use; duplicate tool names are refused as the OpenAI API's.
TEST(AnthropicRequest, ToolUseIdsAndToolNamesAreCheckedAcrossTheConversation) {
  auto call = [](const std::string& id) {
    return Json{{"type", "tool_use"}, {"id", id}, {"name", "get_weather"}, {"input", Json::object()}};
  };
  auto result = [](const std::string& id) {
    return Json{{"role", "user"}, {"content", Json::array({{{"type", "tool_result"}, {"tool_use_id", id}, {"content", "21"}}})}};
  };
  auto assistant = [](Json blocks) { return Json{{"role", "assistant"}, {"content", std::move(blocks)}}; };
  Json b = body(Json::array({user("x"), assistant(Json::array({call("t1")})), result("t1")}));
  EXPECT_EQ(param_of(b), "(accepted)");
  b = body(Json::array({user("x"), assistant(Json::array({call("t1")})), result("t2")}));
  EXPECT_EQ(param_of(b), "messages[2].content[0].tool_use_id");  // answers no tool_use
  b = body(Json::array({result("t1"), assistant(Json::array({call("t1")})), user("y")}));
  EXPECT_EQ(param_of(b), "messages[0].content[0].tool_use_id");  // the tool_use comes later
  b = body(Json::array({user("x"), assistant(Json::array({call("")})), result("")}));
  EXPECT_EQ(param_of(b), "messages[1].content[0].id");  // empty id
  b = body(Json::array({user("x"), assistant(Json::array({call("t1"), call("t1")})), result("t1")}));
  EXPECT_EQ(param_of(b), "messages[1].content[1].id");  // duplicate in one message
  b = body(Json::array({user("x"), assistant(Json::array({call("t1")})), result("t1"),
                        assistant(Json::array({call("t1")})), result("t1")}));
  EXPECT_EQ(param_of(b), "messages[3].content[0].id");  // duplicate across messages
  b = body(Json::array({user("x")}));
  b["tools"] = Json::array({weather_tool(), {{"name", "other"}, {"input_schema", Json::object()}}, weather_tool()});
  EXPECT_EQ(param_of(b), "tools[2].name");
  try {
    parse_messages_request(b, defaults(), {}, false);
  } catch (const ApiException& e) {
    EXPECT_NE(e.error().message.find("\"get_weather\" is given twice"), std::string::npos) << e.error().message;
  }
}

TEST(AnthropicErrors, ShapeAndTypes) {
  const Json e = error_json(ApiError{404, "invalid_request_error", "no such model", "model", "model_not_found"});
  EXPECT_EQ(e, Json::parse(R"({"type": "error", "error": {"type": "not_found_error", "message": "no such model"}})"));
  EXPECT_EQ(error_type(400), "invalid_request_error");
  EXPECT_EQ(error_type(401), "authentication_error");
  EXPECT_EQ(error_type(403), "permission_error");
  EXPECT_EQ(error_type(413), "request_too_large");
  EXPECT_EQ(error_type(429), "rate_limit_error");
  EXPECT_EQ(error_type(500), "api_error");
  EXPECT_EQ(error_type(503), "overloaded_error");
  EXPECT_EQ(Json::parse(error_body(ApiError{500, "server_error", "boom", "", ""}))["error"]["type"], "api_error");
}

TEST(AnthropicResponse, StopReasonsUsageAndContent) {
  EXPECT_EQ(stop_reason(FinishReason::kStop, "", false), "end_turn");
  EXPECT_EQ(stop_reason(FinishReason::kStop, "###", false), "stop_sequence");
  EXPECT_EQ(stop_reason(FinishReason::kLength, "", false), "max_tokens");
  EXPECT_EQ(stop_reason(FinishReason::kContextLimit, "", false), "max_tokens");
  EXPECT_EQ(stop_reason(FinishReason::kStop, "", true), "tool_use");
  GenerationStats s;
  s.prompt_tokens = 100;
  s.reused_tokens = 60;
  s.generated_tokens = 7;
  EXPECT_EQ(usage_json(s), Json::parse(R"({"input_tokens": 40, "cache_creation_input_tokens": 0,
                                          "cache_read_input_tokens": 60, "output_tokens": 7})"));
  ChatAnswer a{"hmm", "It is sunny.", {{"toolu_1_0", "get_weather", R"({"city": "Paris"})"}}};
  ResponseHeader h{"msg_1", 0, "tiny-a"};
  const Json m = message_json(h, a, true, "tool_use", "", usage_json(s));
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "tiny-a");
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  EXPECT_EQ(m["content"], Json::parse(R"([{"type": "thinking", "thinking": "hmm", "signature": ""},
                                          {"type": "text", "text": "It is sunny."},
                                          {"type": "tool_use", "id": "toolu_1_0", "name": "get_weather", "input": {"city": "Paris"}}])"));
  EXPECT_EQ(message_json(h, ChatAnswer{}, false, "stop_sequence", "###", usage_json(s))["stop_sequence"], "###");
  EXPECT_EQ(content_json(ChatAnswer{}, false), Json::parse(R"([{"type": "text", "text": ""}])"));
}

// Rebuilds the content blocks from a stream's events, as a client's accumulator does, and
// checks the documented order of the events.
Json accumulate(const std::string& stream) {
  Json content = Json::array();
  std::vector<std::string> types;
  size_t at = 0;
  while ((at = stream.find("event: ", at)) != std::string::npos) {
    const size_t nl = stream.find('\n', at);
    const std::string type = stream.substr(at + 7, nl - at - 7);
    EXPECT_EQ(stream.compare(nl + 1, 6, "data: "), 0);
    const size_t end = stream.find("\n\n", nl);
    const Json data = Json::parse(stream.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(data["type"], type);
    types.push_back(type);
    if (type == "content_block_start") {
      EXPECT_EQ(data["index"], content.size());
      content.push_back(data["content_block"]);
    } else if (type == "content_block_delta") {
      EXPECT_EQ(data["index"], content.size() - 1);
      Json& block = content.back();
      const Json& d = data["delta"];
      if (d["type"] == "text_delta") block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      else if (d["type"] == "thinking_delta") block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      else if (d["type"] == "input_json_delta") block["input"] = Json::parse(d["partial_json"].get<std::string>());
      else ADD_FAILURE() << d.dump();
    } else if (type == "content_block_stop") {
      EXPECT_EQ(data["index"], content.size() - 1);
    }
    at = end;
  }
  EXPECT_GE(types.size(), 4u);
  EXPECT_EQ(types[0], "message_start");
  EXPECT_EQ(types[1], "ping");
  EXPECT_EQ(types[types.size() - 2], "message_delta");
  EXPECT_EQ(types.back(), "message_stop");
  return content;
}

TEST(AnthropicStream, EventsAddUpToTheMessageContent) {
  ResponseHeader h{"msg_1", 0, "tiny-a"};
  GenerationStats s;
  s.prompt_tokens = 10;
  const Json usage = usage_json(s);
  const std::vector<chat::ToolCall> calls = {{"toolu_1_0", "get_weather", R"({"city": "Paris"})"},
                                            {"toolu_1_1", "get_weather", R"({"city": "Rome"})"}};
  struct Case {
    bool thinking;
    std::vector<ChatDelta> deltas;
    ChatDelta rest;
  };
  const std::vector<Case> cases = {
      {true, {{"Let me", "", {}}, {" think.", "", {}}, {"", "Sunny", {}}, {"", " today.", {}}}, {"", "", calls}},
      {true, {{"", "Direct answer.", {}}}, {}},  // thinking on, but no reasoning came: an empty block
      {true, {}, {}},                            // nothing at all
      {false, {}, {}},                           // nothing at all: one empty text block
      {false, {{"", "Hi", {}}}, {"", "!", {}}},
      {false, {}, {"", "", calls}},
  };
  for (const Case& c : cases) {
    StreamEncoder enc(h, c.thinking);
    std::string stream = enc.start(usage);
    ChatAnswer whole;
    for (const ChatDelta& d : c.deltas) {
      stream += enc.delta(d);
      whole.reasoning += d.reasoning;
      whole.content += d.content;
    }
    stream += enc.finish(c.rest, "end_turn", "", usage);
    whole.content += c.rest.content;
    whole.tool_calls = c.rest.tool_calls;
    EXPECT_EQ(accumulate(stream), content_json(whole, c.thinking)) << stream;
  }
  const std::string err = StreamEncoder::error(ApiError{500, "server_error", "boom", "", ""});
  EXPECT_EQ(err.substr(0, 13), "event: error\n");
}

TEST(AnswerLogitsFilter, BansTokensAndClosesTheReasoningAtTheBudget) {
  EXPECT_EQ(answer_logits_filter(AnswerRules{}), nullptr);
  AnswerRules rules;
  rules.banned = {2};
  rules.think_end = 3;
  rules.thinking_budget = 2;
  LogitsFilter filter = answer_logits_filter(rules);
  ASSERT_NE(filter, nullptr);
  const float never = -std::numeric_limits<float>::infinity();
  auto apply = [&](std::vector<int32_t> generated) {
    std::vector<float> logits = {1, 2, 3, -50, 5};
    filter(generated, logits);
    return logits;
  };
  EXPECT_EQ(apply({}), (std::vector<float>{1, 2, never, -50, 5}));
  EXPECT_EQ(apply({4}), (std::vector<float>{1, 2, never, -50, 5}));
  // Two reasoning tokens: only </think> is left.
  EXPECT_EQ(apply({4, 4}), (std::vector<float>{never, never, never, -50, never}));
  // A new generation that closed its reasoning itself is left alone after the budget.
  EXPECT_EQ(apply({}), (std::vector<float>{1, 2, never, -50, 5}));
  EXPECT_EQ(apply({3, 4, 4}), (std::vector<float>{1, 2, never, -50, 5}));
}

}  // namespace
}  // namespace dsv4::server::anthropic
