// Constrained generation on the random-weight fixtures: whatever the (weak) model prefers, every
// output that finishes is valid for its schema, checked by an independent validator (Debian's
// python3-jsonschema, tests/validate_json.py) — across seeds and sampler settings, for nested
// objects, bounded arrays, enums, numbers, escapes and non-ASCII text, anyOf and $ref — and a
// generation cut by max_tokens says so (finish "length", the value incomplete).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <regex>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/matcher.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/text/tokenizer.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using constrain::Json;

constexpr bool kSanitized = test::kAsan;

struct SchemaCase {
  const char* name;
  const char* schema;
};

const SchemaCase kCases[] = {
    {"nested objects", R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                    "zip": {"type": "integer"}}, "required": ["city", "zip"], "additionalProperties": false},
        "ok": {"type": "boolean"}}, "required": ["name", "address"], "additionalProperties": false})"},
    {"arrays with bounds", R"({"type": "array", "minItems": 1, "maxItems": 3,
        "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}})"},
    {"enums and const", R"({"type": "object", "properties": {"status": {"enum": ["open", "closed", 3, null, true]},
        "kind": {"const": "ticket"}, "level": {"type": "string", "enum": ["low", "high", 7]}},
        "required": ["status", "kind", "level"], "additionalProperties": false})"},
    {"numbers", R"({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"},
        "n": {"type": "integer"}, "list": {"type": "array", "items": {"type": "number"}, "maxItems": 4}},
        "required": ["x", "y", "n", "list"], "additionalProperties": false})"},
    {"strings with escapes and non-ASCII", R"({"type": "array", "maxItems": 3, "items": {"anyOf": [
        {"type": "string", "minLength": 1, "maxLength": 6},
        {"enum": ["naïve", "中文", "tab\there", "quote\"d", "back\\slash", "𝄞"]}]}})"},
    {"anyOf", R"({"anyOf": [{"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer"}},
        "required": ["kind", "x"], "additionalProperties": false},
        {"type": "object", "properties": {"kind": {"const": "label"}, "text": {"type": "string", "maxLength": 5}},
        "required": ["kind", "text"], "additionalProperties": false},
        {"type": ["integer", "null"]}]})"},
    {"oneOf", R"({"$defs": {"cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer",
        "minimum": 1, "maximum": 9}}, "required": ["kind", "lives"], "additionalProperties": false},
        "dog": {"type": "object", "properties": {"kind": {"enum": ["dog", "puppy"]}, "name": {"type": "string", "maxLength": 5}},
        "required": ["kind"], "additionalProperties": false}},
        "type": "array", "maxItems": 3, "items": {"oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}, {"type": "null"},
        {"type": "string", "format": "date"}]}})"},
    {"allOf, if/then/else, tuples, not, multipleOf, dependencies", R"({"$defs": {"base": {"type": "object",
        "properties": {"id": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}}, "required": ["id"]}},
        "type": "array", "maxItems": 3, "items": {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {
        "kind": {"enum": ["a", "b"]}, "pair": {"prefixItems": [{"type": "string", "maxLength": 3}, {"type": "boolean"}], "items": false},
        "x": {"type": "integer", "not": {"enum": [0, 1]}, "maximum": 99}, "y": {"type": "string", "maxLength": 4, "not": {"const": "no"}},
        "z": {"type": "null"}}, "required": ["kind", "pair"],
        "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}, "else": {"required": ["y"]},
        "dependentRequired": {"y": ["z"]}}], "unevaluatedProperties": false}})"},
    {"patternProperties, propertyNames", R"({"type": "object", "properties": {"id": {"type": "integer"},
        "tags": {"type": "object", "propertyNames": {"pattern": "^[A-Z][a-z]*$", "maxLength": 5},
        "additionalProperties": {"type": "boolean"}}}, "required": ["id"],
        "patternProperties": {"^x-[a-z]{1,4}$": {"type": "string", "maxLength": 3}}, "additionalProperties": false})"},
    {"contains, draft 7", R"({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {
        "list": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 50}, "contains": {"minimum": 40},
                 "maxItems": 4},
        "pair": {"type": "array", "items": [{"type": "string", "maxLength": 2}, {"type": "boolean"}], "additionalItems": false},
        "low": {"type": "number", "minimum": 0, "exclusiveMinimum": 1, "maximum": 9},
        "kind": {"enum": ["x", "y"]}, "ex": {"type": "integer"}},
        "required": ["list", "pair", "low", "kind"], "dependencies": {"ex": ["kind"]}, "additionalProperties": false})"},
    {"$ref recursion", R"({"$defs": {"tree": {"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/tree"}}},
        "required": ["v"], "additionalProperties": false}},
        "$ref": "#/$defs/tree"})"},
    {"other keys", R"({"type": "object", "properties": {"id": {"type": "integer"}},
        "required": ["id"], "additionalProperties": {"type": "boolean"}})"},
    {"patterns", R"({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}, "day": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"}, "ip": {"type": "string", "format": "ipv4"},
        "word": {"type": "string", "pattern": "^(?:[a-z]+|\"[^\"]*\")$", "maxLength": 6}, "count": {"type": "integer", "format": "int32", "minimum": -3, "maximum": 250},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1}, "temp": {"type": "number", "exclusiveMinimum": -10, "exclusiveMaximum": 40}},
        "required": ["code", "day", "id", "ip", "word", "count", "ratio", "temp"], "additionalProperties": false})"},
    {"formats", R"({"type": "object", "properties": {
        "at": {"type": "string", "format": "date-time"}, "v6": {"type": "string", "format": "ipv6"},
        "host": {"type": "string", "format": "hostname", "maxLength": 20}, "link": {"type": "string", "format": "uri"},
        "ref": {"type": "string", "format": "uri-reference", "maxLength": 12}, "span": {"type": "string", "format": "duration"},
        "mail": {"type": "string", "format": "email", "maxLength": 16}, "clock": {"type": "string", "format": "time"}},
        "required": ["at", "v6", "host", "link", "ref", "span", "mail", "clock"], "additionalProperties": false})"},
};

// Sampler settings the seeds cycle through: temperature 1 mostly, and every other knob.
SamplingParams sampling_for(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  p.temperature = 1.0f;
  switch (seed % 6) {
    case 1: p.top_k = 8; break;
    case 2: p.top_p = 0.8f; break;
    case 3: p.min_p = 0.05f; break;
    case 4: p.repetition_penalty = 1.3f; p.temperature = 1.5f; break;
    case 5: p.temperature = 0; break;
    default: break;
  }
  return p;
}

// Runs the independent validator (tests/validate_json.py) over JSON lines: its exit status
// (0: every output valid) and its report.
struct Validation {
  int status;
  std::string report;
};
Validation validate(const std::string& lines) {
  test::TempDir tmp;
  test::write_file(tmp / "cases.jsonl", lines);
  const std::string cmd = "/usr/bin/python3 tests/validate_json.py " + tmp / "cases.jsonl" + " >" + tmp / "report" + " 2>&1";
  const int status = std::system(cmd.c_str());
  return {status, test::read_file(tmp / "report")};
}

struct Output {
  std::string text;
  FinishReason finish;
};

class ConstrainedGeneration : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.threads = 1;
    // A random-weight fixture, or the built-in demo model (trained: it has preferences).
    const std::string dir = std::string(GetParam()) == "demo" ? std::string("models/demo") : test::fixture(GetParam());
    engine_ = test::open_engine(dir, o);
    tokenizer_ = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(dir + "/tokenizer.json"));
    vocab_ = std::make_shared<const constrain::TokenTrie>(*tokenizer_);
  }

  // `seeds` generations for `schema` (one shared prefill of the prompt).
  std::vector<Output> generate_many(const Json& schema, int seeds, int64_t max_tokens) {
    constrain::AnswerFormat f;
    f.content_schema = &schema;
    Json messages = Json::array({{{"role", "user"}, {"content", "Answer in JSON."}}});
    messages = text::chat::attach_response_format(messages, schema);
    return generate_many(f, messages, seeds, max_tokens);
  }

  std::vector<Output> generate_many(const constrain::AnswerFormat& f, const Json& messages, int seeds, int64_t max_tokens) {
    auto constraint = std::make_shared<const constrain::CompiledConstraint>(constrain::build_answer_grammar(f), vocab_);
    const std::vector<int32_t> prompt = tokenizer_->encode(text::chat::encode_messages(messages, {}));
    SessionState base = engine_->new_session();
    engine_->forward(base, std::span<const int32_t>(prompt).first(prompt.size() - 1), nullptr, LogitRows::kLast);
    std::vector<Output> out;
    for (int seed = 1; seed <= seeds; ++seed) {
      GenerationRequest req;
      req.prompt = prompt;
      req.sampling = sampling_for(static_cast<uint64_t>(seed));
      req.max_tokens = max_tokens;
      req.stop_ids = {static_cast<int32_t>(engine_->config().eos_token_id)};
      req.constraint = constraint;
      text::IncrementalDecoder decoder(*tokenizer_);
      GenerationCallbacks cb;
      cb.detokenize = [&](int32_t id) { return decoder.push(id); };
      cb.flush = [&] { return decoder.finish(); };
      SessionState session = base;
      const GenerationResult r = generate(*engine_, session, req, cb);
      out.push_back({r.text, r.finish});
    }
    return out;
  }

  // With max_tokens the minimum or a little more, the mask keeps a complete answer within the
  // tokens left: every answer finishes ("stop") and validates, for every schema and sampler.
  void small_budgets(int seeds) {
    std::string lines;
    size_t total = 0, stopped = 0;
    for (const SchemaCase& c : kCases) {
      const Json schema = Json::parse(c.schema);
      constrain::AnswerFormat f;
      f.content_schema = &schema;
      const int64_t min = constrain::CompiledConstraint(constrain::build_answer_grammar(f), vocab_).min_tokens();
      for (int64_t extra : {0, 1, 5, 20}) {
        if (kSanitized && extra == 5) continue;
        for (const Output& o : generate_many(schema, seeds, min + extra)) {
          const bool stop = o.finish == FinishReason::kStop;
          ++total;
          stopped += stop;
          EXPECT_TRUE(stop) << c.name << " max_tokens " << min + extra << ": " << o.text;
          lines += Json{{"kind", "json"}, {"schema", schema}, {"text", o.text}, {"finish", "stop"}}.dump() + "\n";
        }
      }
    }
    const Validation v = validate(lines);
    std::printf("[%s] %zu of %zu small-budget outputs finished; %s", GetParam(), stopped, total, v.report.c_str());
    EXPECT_EQ(v.status, 0) << v.report;
  }

  // The acceptance run: max_tokens 1,200, no truncated invalid answer.
  void budget_1200(int seeds) {
    std::string lines;
    for (const SchemaCase& c : kCases) {
      const Json schema = Json::parse(c.schema);
      for (const Output& o : generate_many(schema, seeds, 1200)) {
        EXPECT_EQ(o.finish, FinishReason::kStop) << c.name << ": " << o.text;
        lines += Json{{"kind", "json"}, {"schema", schema}, {"text", o.text}, {"finish", "stop"}}.dump() + "\n";
      }
    }
    const Validation v = validate(lines);
    std::printf("[%s] max_tokens 1200: %s", GetParam(), v.report.c_str());
    EXPECT_EQ(v.status, 0) << v.report;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::shared_ptr<const constrain::TokenTrie> vocab_;
};

TEST_P(ConstrainedGeneration, EveryFinishedOutputValidatesWithAnIndependentValidator) {
  const int seeds = kSanitized ? 2 : 12;
  std::string lines;
  size_t finished = 0, total = 0;
  std::string all_finished_text;
  for (const SchemaCase& c : kCases) {
    const Json schema = Json::parse(c.schema);
    size_t done_here = 0;
    for (const Output& o : generate_many(schema, seeds, 160)) {
      const bool stop = o.finish == FinishReason::kStop;
      lines += Json{{"kind", "json"}, {"schema", schema}, {"text", o.text}, {"finish", stop ? "stop" : "length"}}.dump() + "\n";
      ++total;
      if (stop) {
        ++finished;
        ++done_here;
        all_finished_text += o.text + "\n";
      }
    }
    // Enough generations finish for the check to mean something (free keys and recursion
    // give a random model room to ramble past max_tokens).
    EXPECT_GE(done_here * 4, static_cast<size_t>(seeds)) << c.name << ": only " << done_here << " of " << seeds << " finished";
  }
  EXPECT_GE(finished * 3, total * 2);
  const Validation v = validate(lines);
  std::printf("[%s] %zu of %zu outputs finished; %s", GetParam(), finished, total, v.report.c_str());
  EXPECT_EQ(v.status, 0) << v.report;
  // The outputs did exercise what the schemas allow.
  if (!kSanitized) {
    EXPECT_TRUE(std::regex_search(all_finished_text, std::regex("[0-9][eE][-+]?[0-9]"))) << "no exponent";
    EXPECT_NE(all_finished_text.find('\\'), std::string::npos) << "no escape";
    EXPECT_TRUE(std::regex_search(all_finished_text, std::regex("[\\x80-\\xff]"))) << "no non-ASCII text";
  }
}

// Forced tool calls: the chat format's parser reads every finished block, and each call's
// arguments validate against its tool's parameters schema.
TEST_P(ConstrainedGeneration, ForcedToolCallArgumentsValidate) {
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "book_flight", "parameters": {"type": "object", "properties": {
      "from": {"type": "string", "minLength": 3, "maxLength": 3}, "to": {"type": "string", "maxLength": 5},
      "seats": {"type": "integer"}, "class": {"enum": ["economy", "business"]},
      "meal": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 4}]},
      "options": {"type": "object", "properties": {"window": {"type": "boolean"}}, "additionalProperties": false},
      "stops": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}},
      "required": ["from", "to", "class"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "now"}}])");
  constrain::AnswerFormat f;
  f.calls_required = true;
  f.max_calls = 2;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& fn = tools[i]["function"];
    f.tools.push_back({fn["name"], fn.contains("parameters") ? &fn["parameters"] : nullptr, "tools"});
  }
  Json messages = Json::array({{{"role", "user"}, {"content", "Book me a flight."}}});
  messages = text::chat::attach_tools(messages, tools);
  const int seeds = kSanitized ? 2 : 12;
  std::string lines;
  size_t blocks = 0, calls = 0;
  // The markup alone takes ~30 tokens per parameter in a 512-token vocabulary.
  for (const Output& o : generate_many(f, messages, seeds, 360)) {
    if (o.finish != FinishReason::kStop) continue;
    text::chat::ParseOptions po;
    po.require_eos = false;
    text::chat::ParsedMessage m;
    ASSERT_NO_THROW(m = text::chat::parse_completion(o.text, po)) << o.text;
    ASSERT_FALSE(m.tool_calls.empty()) << o.text;
    EXPECT_EQ(m.content, "");
    ++blocks;
    for (const auto& call : m.tool_calls) {
      ++calls;
      const Json params = call.name == "now" ? Json::parse(R"({"type": "object", "maxProperties": 0})")
                                             : tools[0]["function"]["parameters"];
      ASSERT_TRUE(call.name == "now" || call.name == "book_flight") << call.name;
      lines += Json{{"kind", "call"}, {"schema", params}, {"arguments", call.arguments}}.dump() + "\n";
    }
  }
  EXPECT_GE(blocks * 3, static_cast<size_t>(seeds)) << "only " << blocks << " of " << seeds << " blocks finished";
  const Validation v = validate(lines);
  std::printf("[%s] %zu tool-call blocks, %zu calls; %s", GetParam(), blocks, calls, v.report.c_str());
  EXPECT_EQ(v.status, 0) << v.report;
}

// Termination within budget: max_tokens below the shortest complete answer is refused up
// front, naming both numbers.
TEST_P(ConstrainedGeneration, MaxTokensBelowTheMinimumIsRefused) {
  const Json schema = Json::parse(kCases[0].schema);
  EXPECT_THROW(
      {
        try {
          generate_many(schema, 1, 6);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("max_tokens is 6"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("takes 41 tokens"), std::string::npos) << e.what();  // {"name":"","address":{"city":"","zip":0}}
          throw;
        }
      },
      Error);
}

// Forced tool calls too (and with reasoning first): a budget just above the shortest block
// still ends in a complete block the chat format's parser reads, arguments valid.
TEST_P(ConstrainedGeneration, ForcedToolCallsFinishWithinSmallBudgets) {
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "book_flight", "parameters": {"type": "object", "properties": {
      "from": {"type": "string", "minLength": 3, "maxLength": 3}, "seats": {"type": "integer"},
      "class": {"enum": ["economy", "business"]}}, "required": ["from", "class"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "now"}}])");
  Json messages = text::chat::attach_tools(Json::array({{{"role", "user"}, {"content", "Book me a flight."}}}), tools);
  std::string lines;
  for (bool thinking : {false, true}) {
    for (size_t only : {size_t{0}, size_t{2}}) {  // book_flight alone, or both tools
      constrain::AnswerFormat f;
      f.calls_required = true;
      f.thinking = thinking;
      f.max_calls = 2;
      for (size_t i = 0; i < (only == 0 ? 1 : only); ++i) {
        const Json& fn = tools[i]["function"];
        f.tools.push_back({fn["name"], fn.contains("parameters") ? &fn["parameters"] : nullptr, "tools"});
      }
      const int64_t min = constrain::CompiledConstraint(constrain::build_answer_grammar(f), vocab_).min_tokens();
      for (int64_t extra : {0, 3, 20}) {
        for (const Output& o : generate_many(f, messages, 1, min + extra)) {
          ASSERT_EQ(o.finish, FinishReason::kStop) << "max_tokens " << min + extra << ": " << o.text;
          text::chat::ParseOptions po;
          po.require_eos = false;
          po.thinking_mode = thinking ? text::chat::ThinkingMode::kThinking : text::chat::ThinkingMode::kChat;
          text::chat::ParsedMessage m;
          ASSERT_NO_THROW(m = text::chat::parse_completion(o.text, po)) << o.text;
          ASSERT_FALSE(m.tool_calls.empty()) << o.text;
          for (const auto& call : m.tool_calls) {
            const Json params = call.name == "now" ? Json::parse(R"({"type": "object", "maxProperties": 0})")
                                                   : tools[0]["function"]["parameters"];
            lines += Json{{"kind", "call"}, {"schema", params}, {"arguments", call.arguments}}.dump() + "\n";
          }
        }
      }
    }
  }
  const Validation v = validate(lines);
  EXPECT_EQ(v.status, 0) << v.report;
}

TEST_P(ConstrainedGeneration, SmallBudgetsJustAboveTheMinimumAlwaysFinishValid) { small_budgets(kSanitized ? 1 : 3); }

TEST_P(ConstrainedGeneration, WithMaxTokens1200EveryAnswerFinishesValid) { budget_1200(kSanitized ? 1 : 2); }

// Where the budget is ample the mask is the unbudgeted one: greedy tokens are identical with
// max_tokens just enough for the unbudgeted answer and with a huge one; a tight budget
// changes them (the squeeze is real).
TEST_P(ConstrainedGeneration, AmpleBudgetKeepsGreedyTokensIdentical) {
  const Json schema = Json::parse(kCases[0].schema);
  constrain::AnswerFormat f;
  f.content_schema = &schema;
  auto constraint = std::make_shared<const constrain::CompiledConstraint>(constrain::build_answer_grammar(f), vocab_);
  Json messages = text::chat::attach_response_format(Json::array({{{"role", "user"}, {"content", "JSON."}}}), schema);
  const std::vector<int32_t> prompt = tokenizer_->encode(text::chat::encode_messages(messages, {}));
  auto run = [&](int64_t max_tokens, uint64_t seed) {
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = sampling_for(seed);
    req.max_tokens = max_tokens;
    req.stop_ids = {static_cast<int32_t>(engine_->config().eos_token_id)};
    req.constraint = constraint;
    GenerationCallbacks cb;
    cb.detokenize = [](int32_t) { return std::string(); };
    SessionState s = engine_->new_session();
    return generate(*engine_, s, req, cb);
  };
  bool squeezed = false;
  for (uint64_t seed : {5u, 1u}) {  // greedy, temperature 1
    const GenerationResult big = run(1 << 20, seed);
    ASSERT_EQ(big.finish, FinishReason::kStop);
    const int64_t n = static_cast<int64_t>(big.tokens.size());
    // The budgeted mask is the plain one while no allowed token would leave too few: with
    // twice the tokens the answer took, and with 600, the tokens are the same.
    for (int64_t max_tokens : {2 * n + 60, int64_t{600}}) {
      const GenerationResult r = run(std::max(max_tokens, constraint->min_tokens()), seed);
      EXPECT_EQ(r.tokens, big.tokens) << "max_tokens " << max_tokens;
      EXPECT_EQ(r.finish, big.finish);
    }
    const int64_t tight = constraint->min_tokens() + 2;
    if (n > tight) {
      const GenerationResult r = run(tight, seed);
      EXPECT_EQ(r.finish, FinishReason::kStop);
      EXPECT_LE(static_cast<int64_t>(r.tokens.size()), tight);
      squeezed = squeezed || r.tokens != big.tokens;
    }
  }
  EXPECT_TRUE(squeezed);
}

TEST_P(ConstrainedGeneration, GreedyPicksTheBestAllowedToken) {
  // The mask leaves allowed logits untouched and sets the rest to -inf; greedy decoding then
  // picks the most likely allowed token (here: one that starts the array).
  const Json schema = Json::parse(R"({"type": "array", "items": {"type": "integer"}, "maxItems": 2})");
  constrain::AnswerFormat f;
  f.content_schema = &schema;
  const constrain::CompiledConstraint c(constrain::build_answer_grammar(f), vocab_);
  auto run = c.begin({});
  const std::vector<int32_t> prompt = tokenizer_->encode("<｜begin▁of▁sentence｜>numbers:");
  SessionState s = engine_->new_session();
  std::vector<float> logits(static_cast<size_t>(engine_->config().vocab_size));
  engine_->forward(s, prompt, logits.data(), LogitRows::kLast);
  std::vector<float> masked = logits;
  run->mask(masked);
  int32_t best = -1;
  size_t finite = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(masked[i])) continue;
    ++finite;
    const int32_t id = static_cast<int32_t>(i);
    ASSERT_TRUE(id < tokenizer_->vocab_size() && !tokenizer_->is_added(id)) << id;
    EXPECT_EQ(tokenizer_->token_bytes(id)[0], '[') << id;
    EXPECT_EQ(masked[i], logits[i]);  // allowed logits are untouched
    if (best < 0 || logits[i] > logits[static_cast<size_t>(best)]) best = id;
  }
  EXPECT_TRUE(std::isfinite(masked[static_cast<size_t>(*tokenizer_->token_id("["))]));
  EXPECT_LT(finite, logits.size() / 4);
  GenerationRequest req;
  req.prompt = prompt;
  req.sampling.temperature = 0;
  req.max_tokens = 64;
  req.constraint = std::make_shared<const constrain::CompiledConstraint>(constrain::build_answer_grammar(f), vocab_);
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t) { return std::string(); };
  SessionState fresh = engine_->new_session();
  const std::vector<int32_t> tokens = generate(*engine_, fresh, req, cb).tokens;
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens[0], best);
}

TEST_P(ConstrainedGeneration, LogprobsAreTheModelsOwnAndDraftingKeepsTokensAndLogprobs) {
  // Log-probabilities under a constraint are log-softmax of the engine's logits before the mask
  // (teacher-forced logits agree); with drafting, every token's entry comes from the verify
  // pass's row that drew it, so tokens and log-probabilities equal plain decoding's bit for bit.
  const Json schema = Json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["n", "tags"],
      "additionalProperties": false})");
  constrain::AnswerFormat f;
  f.content_schema = &schema;
  auto constraint = std::make_shared<const constrain::CompiledConstraint>(constrain::build_answer_grammar(f), vocab_);
  Json messages = text::chat::attach_response_format(Json::array({{{"role", "user"}, {"content", "JSON."}}}), schema);
  const std::vector<int32_t> prompt = tokenizer_->encode(text::chat::encode_messages(messages, {}));
  const int64_t V = engine_->config().vocab_size;
  struct Run {
    GenerationResult result;
    std::vector<std::vector<float>> masked;  // the rows drawn from, after the mask
  };
  auto run = [&](GenerationRequest req) {
    Run out;
    GenerationCallbacks cb;
    cb.detokenize = [](int32_t) { return std::string(); };
    cb.on_logits = [&](std::span<const float> l) { out.masked.emplace_back(l.begin(), l.end()); };
    SessionState s = engine_->new_session();
    out.result = generate(*engine_, s, req, cb);
    return out;
  };
  int masked_top = 0, drafted = 0, accepted = 0;
  for (uint64_t seed : {1u, 5u, 7u}) {  // temperature 1, greedy, temperature 1
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = sampling_for(seed);
    req.max_tokens = 24;
    req.stop_ids = {static_cast<int32_t>(engine_->config().eos_token_id)};
    req.constraint = constraint;
    req.top_logprobs = 3;
    const Run plain = run(req);
    const GenerationResult& g = plain.result;
    ASSERT_FALSE(g.tokens.empty());
    const bool stopped_by_id = g.tokens.back() == req.stop_ids[0];
    ASSERT_EQ(g.logprobs.size(), g.tokens.size() - (stopped_by_id ? 1 : 0));

    // Teacher-forced logits of the same tokens.
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), g.tokens.begin(), g.tokens.end() - 1);
    std::vector<float> logits(all.size() * static_cast<size_t>(V));
    SessionState t = engine_->new_session();
    engine_->forward(t, all, logits.data(), LogitRows::kAll);
    for (size_t i = 0; i < g.logprobs.size(); ++i) {
      const float* row = logits.data() + (prompt.size() - 1 + i) * static_cast<size_t>(V);
      const double log_z = test::log_z(std::span<const float>(row, static_cast<size_t>(V)));
      const TokenLogprob& lp = g.logprobs[i];
      EXPECT_EQ(lp.token, g.tokens[i]);
      EXPECT_NEAR(lp.logprob, row[lp.token] - log_z, 1e-4) << "step " << i;
      ASSERT_EQ(lp.top.size(), 3u);
      for (const auto& [id, l] : lp.top) EXPECT_NEAR(l, row[id] - log_z, 1e-4) << "step " << i;
      // The model's favourite was often a token the constraint forbade: logprobs are unmasked.
      masked_top += !std::isfinite(plain.masked[i][static_cast<size_t>(lp.top[0].first)]);
    }

    std::vector<int32_t> wrong = g.tokens;
    for (size_t i = 1; i < wrong.size(); i += 3) wrong[i] = (wrong[i] + 1) % static_cast<int32_t>(V);
    const std::vector<int32_t>* oracles[] = {&g.tokens, &wrong};
    for (const std::vector<int32_t>* oracle : oracles) {
      GenerationRequest r = req;
      r.spec = SpecMode::kOracle;
      r.draft_max = 4;
      r.oracle = *oracle;
      const Run d = run(r);
      SCOPED_TRACE(oracle == &wrong ? "oracle wrong every 3rd" : "oracle right");
      EXPECT_EQ(d.result.tokens, g.tokens);
      EXPECT_EQ(d.result.finish, g.finish);
      ASSERT_EQ(d.result.logprobs.size(), g.logprobs.size());
      for (size_t i = 0; i < g.logprobs.size(); ++i) {
        EXPECT_EQ(d.result.logprobs[i].token, g.logprobs[i].token) << i;
        EXPECT_EQ(std::bit_cast<uint32_t>(d.result.logprobs[i].logprob), std::bit_cast<uint32_t>(g.logprobs[i].logprob)) << i;
        EXPECT_EQ(d.result.logprobs[i].top, g.logprobs[i].top) << i;
      }
      drafted += d.result.stats.drafted_tokens;
      accepted += d.result.stats.accepted_tokens;
    }
  }
  EXPECT_GT(masked_top, 0);
  EXPECT_GT(drafted, 20);
  EXPECT_GT(accepted, 10);
  EXPECT_GT(drafted, accepted);  // drafts were taken back too
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ConstrainedGeneration, ::testing::Values("tiny-a", "flashlike"));

// The same budget checks on the built-in demo model.
class ConstrainedDemo : public ConstrainedGeneration {};
TEST_P(ConstrainedDemo, SmallBudgetsJustAboveTheMinimumAlwaysFinishValid) { small_budgets(1); }
TEST_P(ConstrainedDemo, WithMaxTokens1200EveryAnswerFinishesValid) { budget_1200(1); }
INSTANTIATE_TEST_SUITE_P(DemoModel, ConstrainedDemo, ::testing::Values("demo"));

}  // namespace
}  // namespace dsv4
