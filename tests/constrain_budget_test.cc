// Termination within budget: the shortest complete output of a grammar (Grammar::min_symbols,
// tokens_to_finish), checked against hand-counted texts; the count is a real path (from any
// state some symbol needs one token less); and the budgeted mask keeps every random walk
// complete within its max_tokens while leaving an ample budget's masks exactly as they were.
#include <gtest/gtest.h>

#include <random>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/grammar.h"
#include "dsv4/constrain/json_schema.h"
#include "dsv4/constrain/matcher.h"
#include "dsv4/constrain/token_trie.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/text/tokenizer.h"
#include "grammar_util.h"
#include "test_util.h"

namespace dsv4::constrain {
namespace {

// The symbols of `text` (the chat format's specials count one each).
uint64_t symbols_of(const Grammar& g, std::string_view text) { return g.symbols(text).size(); }

struct MinCase {
  const char* schema;
  const char* shortest;  // a shortest valid text, counted by hand
  bool needs_end;        // the text could go on: the end token counts too
};

const MinCase kMinCases[] = {
    {R"({"type": "string", "minLength": 3})", R"("aaa")", false},
    {R"({"type": "string", "minLength": 2, "maxLength": 9})", R"("aa")", false},
    {R"({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"},
        "x": {"type": "string"}}, "required": ["b"]}, "c": {"type": "string"}}, "required": ["a"]})",
     R"({"a":{"b":0}})", false},
    {R"({"type": "object", "properties": {"p": {"type": "boolean"}, "q": {"type": "null"}, "r": {"type": "string", "minLength": 1}},
        "required": ["p", "q", "r"], "additionalProperties": false})",
     R"({"p":true,"q":null,"r":"a"})", false},
    {R"({"type": "object", "properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}}, "required": ["next"]})",
     R"({"next":null})", false},
    {R"({"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}}, "$ref": "#/$defs/t"})", "[]",
     false},
    {R"({"type": "array", "minItems": 2, "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}}})",
     "[[0],[0]]", false},
    {R"({"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "minItems": 1,
        "items": {"anyOf": [{"$ref": "#/$defs/node"}, {"const": 7}]}}}, "required": ["kids"]}}, "$ref": "#/$defs/node"})",
     R"({"kids":[7]})", false},
    {R"({"enum": ["abc", 12, "z"]})", "12", false},
    {R"({"enum": [1, 12]})", "1", true},
    {R"({"type": "number"})", "0", true},
    {R"({"type": "integer"})", "0", true},
    {R"({"type": "object"})", "{}", false},
    {R"(true)", "0", true},
    {R"({"type": ["string", "null"]})", R"("")", false},
};

TEST(ConstrainBudget, MinimumOfEachGrammarIsTheHandCountedText) {
  for (const MinCase& c : kMinCases) {
    SCOPED_TRACE(c.schema);
    const Grammar g = content_grammar(c.schema);
    ASSERT_TRUE(accepts(g, c.shortest)) << c.shortest;
    const uint64_t want = symbols_of(g, c.shortest) + (c.needs_end ? 1 : 0);
    EXPECT_EQ(g.min_symbols(g.root()), symbols_of(g, c.shortest));
    EXPECT_EQ(g.min_output_tokens(), want);
    EXPECT_EQ(tokens_to_finish(g, initial_stacks(g)), want);
    // With reasoning first: the </think> token more.
    const Grammar t = content_grammar(c.schema, true);
    EXPECT_EQ(t.min_output_tokens(), want + 1);
  }
}

TEST(ConstrainBudget, MinimumOfAForcedToolCall) {
  const Json params = Json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "minLength": 2},
      "n": {"type": "integer"}, "opt": {"type": "boolean"}}, "required": ["city", "n"]})");
  AnswerFormat f;
  f.calls_required = true;
  f.tools = {{"weather", &params, "tools[0].function.parameters"}, {"now", nullptr, "tools[1].function.parameters"}};
  const std::string d(text::chat::kDsml);
  const Grammar g = build_answer_grammar(f);
  // The shortest block calls "now" (no parameters).
  const std::string now = "\n\n<" + d + "tool_calls>\n<" + d + "invoke name=\"now\">\n\n</" + d + "invoke>\n</" + d + "tool_calls>";
  ASSERT_TRUE(accepts(g, now));
  EXPECT_EQ(g.min_output_tokens(), symbols_of(g, now));
  // Only "weather": both required parameters, the string one as raw text.
  f.tools.pop_back();
  const Grammar w = build_answer_grammar(f);
  const std::string weather = "\n\n<" + d + "tool_calls>\n<" + d + "invoke name=\"weather\">\n<" + d +
                              "parameter name=\"city\" string=\"true\">aa</" + d + "parameter>\n<" + d +
                              "parameter name=\"n\" string=\"false\">0</" + d + "parameter>\n</" + d + "invoke>\n</" + d +
                              "tool_calls>";
  ASSERT_TRUE(accepts(w, weather));
  EXPECT_EQ(w.min_output_tokens(), symbols_of(w, weather));
}

// All symbols, specials included.
std::vector<Symbol> all_symbols(const Grammar& g) {
  std::vector<Symbol> out;
  for (int b = 0; b < 256; ++b) out.push_back(static_cast<Symbol>(b));
  for (size_t k = 0; k < g.specials().size(); ++k) out.push_back(static_cast<Symbol>(kFirstSpecial + k));
  return out;
}

// From `set`, the count is a path: symbols each needing one token less lead to a complete
// output in exactly that many tokens (the last one the end token where the text could go on).
void expect_count_is_a_path(const Grammar& g, StackSet set, const std::string& where) {
  const std::vector<Symbol> symbols = all_symbols(g);
  uint64_t need = tokens_to_finish(g, set);
  ASSERT_LT(need, 100000u) << where;
  for (uint64_t taken = 0;; ++taken) {
    if (need == 0) {
      EXPECT_TRUE(is_complete(set)) << where;
      return;
    }
    if (need == 1 && can_end(g, set)) return;  // the end token
    bool found = false;
    for (Symbol s : symbols) {
      StackSet next = advance(g, set, s);
      if (next.empty() || tokens_to_finish(g, next) != need - 1) continue;
      set = std::move(next);
      --need;
      found = true;
      break;
    }
    if (!found) {
      std::string seen;  // what each symbol would leave, for the report
      for (Symbol s : symbols)
        if (StackSet next = advance(g, set, s); !next.empty())
          seen += (s < 256 ? std::string(1, static_cast<char>(s)) : "<special>") + "=" + std::to_string(tokens_to_finish(g, next)) + " ";
      ADD_FAILURE() << "next symbols: " << seen;
    }
    ASSERT_TRUE(found) << where << ": no symbol needs " << need - 1 << " after " << taken << " symbols";
  }
}

const char* kWalkSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "zip": {"type": "integer"}},
        "required": ["city", "zip"], "additionalProperties": false}, "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b\"c", "中"]}, "minItems": 1, "maxItems": 3}},
        "required": ["name", "address", "tags"], "additionalProperties": false})",
    R"({"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "array", "items": {"type": "number"}, "minItems": 2}})",
    R"({"anyOf": [{"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer"}},
        "required": ["kind", "x"], "additionalProperties": false}, {"type": ["integer", "null"]},
        {"type": "string", "minLength": 4}]})",
    R"({"$defs": {"tree": {"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/tree"}}}, "required": ["v"]}},
        "$ref": "#/$defs/tree"})",
    R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": {"type": "boolean"}})",
    R"({"type": "object"})",
    R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
        "when": {"type": "string", "format": "date-time"}, "ip": {"type": "string", "format": "ipv6"},
        "tag": {"type": "string", "pattern": "^[a-z\"\\\\/]+$", "maxLength": 5}, "mail": {"type": "string", "format": "email"},
        "n": {"type": "integer", "minimum": 5, "maximum": 1200}, "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 2}},
        "required": ["id", "when", "ip", "tag", "n", "x"], "additionalProperties": false})",
    R"({"type": "array", "items": {"type": "integer", "minimum": -20, "exclusiveMaximum": 7}, "maxItems": 4})",
};

TEST(ConstrainBudget, CountIsAPathFromEveryStateOfRandomWalks) {
  std::mt19937 rng(7);
  for (const char* schema : kWalkSchemas) {
    for (bool thinking : {false, true}) {
      const Grammar g = content_grammar(schema, thinking);
      const std::vector<Symbol> symbols = all_symbols(g);
      for (int walk = 0; walk < 6; ++walk) {
        StackSet set = initial_stacks(g);
        std::string text;
        for (int step = 0; step < 60 && !is_complete(set); ++step) {
          expect_count_is_a_path(g, set, std::string(schema).substr(0, 40) + " after \"" + text + "\"");
          if (HasFatalFailure()) return;
          // A random next symbol, mostly printable ASCII so the walk goes somewhere.
          std::vector<std::pair<Symbol, StackSet>> options;
          for (Symbol s : symbols) {
            if (s < 256 && (s < 0x20 || s > 0x7e) && rng() % 8 != 0) continue;
            StackSet next = advance(g, set, s);
            if (!next.empty()) options.emplace_back(s, std::move(next));
          }
          ASSERT_FALSE(options.empty());
          auto& pick = options[std::uniform_int_distribution<size_t>(0, options.size() - 1)(rng)];
          text += pick.first < 256 ? std::string(1, static_cast<char>(pick.first)) : "<special>";
          set = std::move(pick.second);
        }
      }
    }
  }
}

// Random walks over the fixture's tokens with the budgeted mask: with max_tokens the minimum
// or a little more, every walk ends complete (or at an allowed end token) within it, and the
// text is valid; with an ample budget the masks are exactly the unbudgeted ones.
TEST(ConstrainBudget, BudgetedMaskAlwaysCompletesWithinMaxTokens) {
  const text::Tokenizer tok = text::Tokenizer::from_file(test::fixture("tiny-a/tokenizer.json"));
  const auto vocab = std::make_shared<const TokenTrie>(tok);
  const std::vector<int32_t> ends = {*tok.eos_id()};
  std::mt19937 rng(11);
  int walks = 0;
  for (const char* schema : kWalkSchemas) {
    const Grammar g = content_grammar(schema);
    const CompiledConstraint c(content_grammar(schema), vocab);
    const int64_t min = c.min_tokens();
    ASSERT_EQ(static_cast<uint64_t>(min), g.min_output_tokens());
    for (int64_t extra : {0, 1, 5, 20}) {
      const int64_t max_tokens = min + extra;
      for (int seed = 0; seed < 3; ++seed) {
        std::vector<int32_t> tokens;
        std::string text;
        bool ended = false;
        while (static_cast<int64_t>(tokens.size()) < max_tokens) {
          const int64_t left = max_tokens - static_cast<int64_t>(tokens.size());
          const std::vector<bool> m = c.allowed_after(tokens, ends, left);
          std::vector<int32_t> allowed;
          for (size_t i = 0; i < m.size(); ++i)
            if (m[i]) allowed.push_back(static_cast<int32_t>(i));
          ASSERT_FALSE(allowed.empty()) << schema << " after " << text;
          // Mostly long tokens (the ones that waste the budget), sometimes any.
          int32_t next = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
          if (rng() % 4 != 0)
            for (int tries = 0; tries < 8; ++tries) {
              const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
              if (t != ends[0] && tok.token_bytes(t).size() > tok.token_bytes(next).size()) next = t;
            }
          if (next == ends[0]) {
            ended = true;
            break;
          }
          tokens.push_back(next);
          text += tok.token_bytes(next);
          if (c.tokens_to_finish_after(tokens) == 0) {
            ended = true;
            break;
          }
        }
        if (!ended) {
          // Out of tokens: the text must be complete anyway (it may end; the end token would
          // have been the next one).
          ended = accepts(g, text);
        }
        EXPECT_TRUE(ended) << schema << " max_tokens " << max_tokens << ": " << text;
        EXPECT_TRUE(accepts(g, text)) << schema << " max_tokens " << max_tokens << ": " << text;
        EXPECT_TRUE(Json::accept(text)) << text;
        ++walks;
      }
    }
  }
  EXPECT_EQ(walks, static_cast<int>(std::size(kWalkSchemas)) * 4 * 3);
}

TEST(ConstrainBudget, AmpleBudgetLeavesTheMaskUnchanged) {
  const text::Tokenizer tok = text::Tokenizer::from_file(test::fixture("tiny-a/tokenizer.json"));
  const auto vocab = std::make_shared<const TokenTrie>(tok);
  const std::vector<int32_t> ends = {*tok.eos_id()};
  std::mt19937 rng(3);
  int narrowed = 0;
  for (const char* schema : kWalkSchemas) {
    const CompiledConstraint c(content_grammar(schema), vocab);
    std::vector<int32_t> tokens;
    for (int step = 0; step < 40; ++step) {
      const std::vector<bool> plain = c.allowed_after(tokens, ends);
      EXPECT_EQ(c.allowed_after(tokens, ends, 100000), plain) << schema << " step " << step;
      // A budget of exactly what is needed narrows the mask (or leaves only one way).
      const uint64_t need = c.tokens_to_finish_after(tokens);
      const std::vector<bool> tight = c.allowed_after(tokens, ends, static_cast<int64_t>(std::max<uint64_t>(need, 1)));
      for (size_t i = 0; i < tight.size(); ++i) EXPECT_TRUE(!tight[i] || plain[i]) << "token " << i;
      narrowed += tight != plain;
      std::vector<int32_t> allowed;
      for (size_t i = 0; i < plain.size(); ++i)
        if (plain[i] && static_cast<int32_t>(i) != ends[0]) allowed.push_back(static_cast<int32_t>(i));
      if (allowed.empty()) break;
      tokens.push_back(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]);
      if (c.tokens_to_finish_after(tokens) == 0) break;
    }
  }
  EXPECT_GT(narrowed, 10);
}

}  // namespace
}  // namespace dsv4::constrain
