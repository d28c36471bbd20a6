// The tokenizer on the fixtures' tokenizer.json: the fixture goldens, lookups, streaming decode,
// invalid UTF-8, hostile files, and the dsv4 tokenize command. (The Hugging Face comparison on
// generated text is tokenizer_oracle_test.cc.)
#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dsv4/text/pre_tokenizer.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/text/unicode_delta.h"
#include "dsv4/text/utf8.h"
#include "dsv4/util/error.h"
#include "test_util.h"

namespace dsv4::text {
namespace {

using nlohmann::json;

const std::string kFixtureTokenizer = test::fixture("tiny-a/tokenizer.json");

const Tokenizer& fixture_tokenizer() {
  static const Tokenizer tok = Tokenizer::from_file(kFixtureTokenizer);
  return tok;
}

TEST(Tokenizer, FixtureGoldenCases) {
  for (const char* name : {"tiny-a", "flashlike"}) {
    const Tokenizer tok = Tokenizer::from_file(test::fixture(std::string(name) + "/tokenizer.json"));
    const json cases = json::parse(test::read_file(test::fixture(std::string(name) + "/tokenizer_tests.json")))["cases"];
    ASSERT_GE(cases.size(), 16u);
    for (const auto& c : cases) {
      const std::string text = c["text"];
      EXPECT_EQ(tok.encode(text), c["ids"].get<std::vector<TokenId>>()) << text;
      EXPECT_EQ(tok.decode(tok.encode(text)), text);
    }
  }
}

TEST(Tokenizer, SpecialTokensAreFoundByTextAndConfig) {
  const Tokenizer& tok = fixture_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.token_id("<｜User｜>"), 499);
  EXPECT_EQ(tok.token_id("</think>"), 502);
  EXPECT_EQ(tok.token_id("｜DSML｜"), 503);
  EXPECT_EQ(tok.token_id("Ġt"), 256);  // a vocabulary entry by its tokenizer.json spelling
  EXPECT_EQ(tok.token_id("no such token"), std::nullopt);
  EXPECT_THROW(tok.require_token_id("no such token"), Error);
  EXPECT_EQ(tok.bos_id(), 496);  // from tokenizer_config.json next to tokenizer.json
  EXPECT_EQ(tok.eos_id(), 497);
  EXPECT_TRUE(tok.is_special(497));
  EXPECT_TRUE(tok.is_added(497));
  EXPECT_FALSE(tok.is_special(65));
  EXPECT_EQ(tok.token_string(256), "Ġt");
  EXPECT_EQ(tok.token_bytes(256), " t");
  EXPECT_EQ(tok.token_string(499), "<｜User｜>");
  EXPECT_FALSE(tok.contains(512));
  EXPECT_FALSE(tok.contains(-1));
}

TEST(Tokenizer, NoBosIsAddedAndSpecialsMatchInsideText) {
  const Tokenizer& tok = fixture_tokenizer();
  EXPECT_EQ(tok.encode(""), std::vector<TokenId>{});
  const auto ids = tok.encode("x<｜User｜>y<｜Use");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 'x');
  EXPECT_EQ(ids[1], 499);
  EXPECT_EQ(ids[2], 'y');
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 499), 1);  // the cut-off "<｜Use" is plain text
  EXPECT_EQ(tok.decode(ids), "x<｜User｜>y<｜Use");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "xy<｜Use");
}

TEST(Tokenizer, AddedTokensInPlainRangesAreOrdinaryText) {
  const Tokenizer& tok = fixture_tokenizer();
  // "<｜User｜>" written by a user (bytes 1..) is plain; the template's one (byte 0) is a token.
  const std::string user = "<｜User｜>y<｜end▁of▁sentence｜>";
  const std::string text = "x" + user + "<｜User｜>";
  const TextRange plain[] = {{1, 1 + user.size()}};
  const std::vector<TokenId> ids = tok.encode(text, plain);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 499), 1);
  EXPECT_EQ(ids.back(), 499);
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_FALSE(tok.is_added(ids[i])) << i;
  // The plain text tokenizes as it would alone, and text without added tokens as encode() does.
  EXPECT_EQ(tok.encode_plain(user), std::vector<TokenId>(ids.begin() + 1, ids.end() - 1));
  const std::string ab_cd = "ab<｜User｜>cd";
  EXPECT_EQ(tok.encode(ab_cd, std::vector<TextRange>{{0, 2}, {ab_cd.size() - 2, ab_cd.size()}}), tok.encode(ab_cd));
  // A token that would reach into a plain range is not recognised.
  EXPECT_EQ(tok.encode("<｜User｜>", std::vector<TextRange>{{5, 6}}), tok.encode_plain("<｜User｜>"));
  EXPECT_THROW(tok.encode("abc", std::vector<TextRange>{{2, 1}}), Error);
  EXPECT_THROW(tok.encode("abc", std::vector<TextRange>{{0, 4}}), Error);
}

TEST(Tokenizer, BoundedEncodeStopsAtTheLimit) {
  const Tokenizer& tok = fixture_tokenizer();
  const std::string text = "The keeper climbed the stairs <｜User｜> and lit the lamp. 12345 你好";
  const std::vector<TokenId> all = tok.encode(text);
  for (size_t max = 0; max <= all.size() + 2; ++max) {
    const std::vector<TokenId> some = tok.encode(text, {}, max);
    EXPECT_EQ(some.size(), std::min(max, all.size())) << max;
    if (max > all.size()) {
      EXPECT_EQ(some, all);
    }
  }
  // A huge text (one word, and many short words) costs what the limit costs: the result says
  // "more than 100" without the text being split or merged, as the time limit checks.
  const std::string word(64u << 20, 'a');
  std::string words;
  for (int i = 0; i < (4 << 20); ++i) words += " ab";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(tok.encode_plain(word, 101).size(), 101u);
  EXPECT_EQ(tok.encode_plain(words, 101).size(), 101u);
  EXPECT_EQ(tok.encode(words, {}, 101), tok.encode(words.substr(0, 1000), {}, 101));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  const Tokenizer& tok = fixture_tokenizer();
  EXPECT_THROW(tok.decode(std::vector<TokenId>{1, 512}), Error);
  EXPECT_THROW(tok.decode(std::vector<TokenId>{-3}), Error);
  EXPECT_THROW(tok.token_bytes(99999), Error);
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacters) {
  const Tokenizer& tok = fixture_tokenizer();
  // "a", a lone continuation byte, a cut 3-byte character, an overlong, a surrogate, "b".
  const std::string bad = "a\x80\xE4\xBD\xC0\x80\xED\xA0\x80" "b";
  const std::string repaired = "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b";
  EXPECT_EQ(to_valid_utf8(bad), repaired);
  EXPECT_EQ(tok.encode(bad), tok.encode(repaired));
  EXPECT_EQ(tok.decode(tok.encode(bad)), repaired);
  // Decoding lone bytes of a character yields U+FFFD, as Hugging Face does.
  EXPECT_EQ(tok.decode(std::vector<TokenId>{0xE4, 0xBD}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{0xE4, 0xBD, 0xA0}), "你");
}

TEST(Tokenizer, IncrementalDecoderEmitsOnlyCompleteCharacters) {
  const Tokenizer& tok = fixture_tokenizer();
  const std::string text = "A 你好 🙂! <｜User｜>é";
  const auto ids = tok.encode(text);
  IncrementalDecoder stream(tok);
  std::string out;
  for (TokenId id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(piece));
    out += piece;
  }
  EXPECT_EQ(stream.pending_bytes(), 0u);
  out += stream.finish();
  EXPECT_EQ(out, text);
  // The bytes of one emoji arrive one per token: nothing comes out until the last one.
  IncrementalDecoder emoji(tok);
  EXPECT_EQ(emoji.push(0xF0), "");
  EXPECT_EQ(emoji.push(0x9F), "");
  EXPECT_EQ(emoji.push(0x99), "");
  EXPECT_EQ(emoji.pending_bytes(), 3u);
  EXPECT_EQ(emoji.push(0x82), "🙂");
  // A character cut off at the end of the stream comes out as U+FFFD.
  EXPECT_EQ(emoji.push(0xE4), "");
  EXPECT_EQ(emoji.finish(), "\xEF\xBF\xBD");
  // An impossible byte is replaced at once instead of being held back.
  EXPECT_EQ(emoji.push(0xFF), "\xEF\xBF\xBD");
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  const Tokenizer tok = Tokenizer::from_file(kFixtureTokenizer);
  const std::string text = test::read_file(test::fixture("tiny-a/tokenizer_tests.json"));
  const auto expected = tok.encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) ok[static_cast<size_t>(t)] += tok.encode(text) == expected;
    });
  for (auto& th : threads) th.join();
  for (int v : ok) EXPECT_EQ(v, 5);
  EXPECT_GT(tok.cached_words(), 0u);
}

// ---- hostile or unsupported files ----------------------------------------------------------

json fixture_json() { return json::parse(test::read_file(kFixtureTokenizer)); }

std::string load_error(const json& j) {
  try {
    Tokenizer::from_json(j.dump(), "bad/tokenizer.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(TokenizerLoad, RefusesUnsupportedComponentsNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(json&)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"model type", [](json& j) { j["model"]["type"] = "Unigram"; }, "model.type"},
      {"normalizer", [](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer.type"},
      {"non-empty normalizer", [](json& j) { j["normalizer"]["normalizers"].push_back({{"type", "NFC"}}); }, "normalizer.normalizers"},
      {"split behaviour", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "pre_tokenizer.pretokenizers[0].behavior"},
      {"split invert", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["invert"] = true; }, "pre_tokenizer.pretokenizers[1].invert"},
      {"bad regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
      {"empty-matching regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a*"; }, "can match the empty string"},
      {"other pre-tokenizer", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}}; }, "pre_tokenizer.pretokenizers[0].type"},
      {"no byte level", [](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(3); }, "no ByteLevel"},
      {"byte level regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][3]["use_regex"] = true; }, "use_regex"},
      {"decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder.type"},
      {"post processor", [](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }, "post_processor.type"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {"byte fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {"prefix", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "model.continuing_subword_prefix"},
      {"truncation", [](json& j) { j["truncation"] = {{"max_length", 5}}; }, "truncation"},
      {"merge out of vocab", [](json& j) { j["model"]["merges"][0] = "Ġ zz"; }, "model.merges[0]"},
      {"merge form", [](json& j) { j["model"]["merges"][1] = "a b c"; }, "model.merges[1]"},
      {"merge array", [](json& j) { j["model"]["merges"][2] = json::array({"a"}); }, "model.merges[2]"},
      {"negative id", [](json& j) { j["model"]["vocab"]["a"] = -5; }, "model.vocab[\"a\"]"},
      {"huge id", [](json& j) { j["model"]["vocab"]["a"] = 1ll << 40; }, "model.vocab[\"a\"]"},
      {"duplicate id", [](json& j) { j["model"]["vocab"]["a"] = 98; }, "repeats the id"},
      {"wrong added id", [](json& j) { j["added_tokens"][3]["id"] = 400; }, "added_tokens[3].id"},
      {"lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "added_tokens[0].lstrip"},
      {"empty added", [](json& j) { j["added_tokens"][0]["content"] = ""; }, "added_tokens[0].content"},
      {"string vocab", [](json& j) { j["model"]["vocab"] = "x"; }, "model.vocab must be an object"},
  };
  for (const auto& c : cases) {
    json j = fixture_json();
    c.mutate(j);
    const std::string error = load_error(j);
    EXPECT_NE(error.find("bad/tokenizer.json"), std::string::npos) << c.what << ": " << error;
    EXPECT_NE(error.find(c.expect), std::string::npos) << c.what << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << c.what;
  }
  EXPECT_NE(load_error(json::parse("[1,2]")).find("top level must be an object"), std::string::npos);
  try {
    Tokenizer::from_json("{\"model\": ", "bad/tokenizer.json");
    ADD_FAILURE() << "truncated JSON loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
}

TEST(TokenizerLoad, AcceptsArrayMergesAndStringPatterns) {
  json j = fixture_json();
  for (auto& m : j["model"]["merges"]) {
    const std::string s = m;
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  j["pre_tokenizer"]["pretokenizers"].insert(j["pre_tokenizer"]["pretokenizers"].begin(),
                                             json{{"type", "Split"}, {"pattern", {{"String", "||"}}}, {"behavior", "Isolated"}, {"invert", false}});
  const Tokenizer tok = Tokenizer::from_json(j.dump(), "variant.json");
  EXPECT_EQ(tok.encode("Hello world!"), fixture_tokenizer().encode("Hello world!"));
  EXPECT_EQ(tok.encode("a||b"), (std::vector<TokenId>{'a', '|', '|', 'b'}));
  EXPECT_EQ(tok.bos_id(), std::nullopt);  // no tokenizer_config.json given
}

TEST(TokenizerLoad, BadTokenizerConfigIsReported) {
  const std::string text = test::read_file(kFixtureTokenizer);
  EXPECT_THROW(Tokenizer::from_json(text, "t.json", "{\"bos_token\": \"<nope>\"}", "c.json"), Error);
  EXPECT_THROW(Tokenizer::from_json(text, "t.json", "not json", "c.json"), Error);
  const Tokenizer tok = Tokenizer::from_json(text, "t.json", R"({"bos_token": {"content": "<｜User｜>"}, "eos_token": null})", "c.json");
  EXPECT_EQ(tok.bos_id(), 499);
  EXPECT_EQ(tok.eos_id(), std::nullopt);
}

TEST(TokenizerUnicode, WidensCategoryClassesInsideAndOutsideBrackets) {
  const std::string out = widen_unicode_classes(R"([^\r\n\p{L}\p{P}]?\p{M}+|\pS|\p{Lu}|\P{L}|\Q\p{L}[\E|[]\p{N}]|\[\p{N})");
  // Outside a class \p{M} becomes a class; inside, ranges are appended in place.
  EXPECT_EQ(out.rfind("[^\\r\\n\\p{L}\\x{", 0), 0u) << out;
  EXPECT_NE(out.find("[\\p{M}\\x{"), std::string::npos) << out;
  EXPECT_NE(out.find("[\\pS\\x{"), std::string::npos) << out;
  EXPECT_NE(out.find("|\\p{Lu}|\\P{L}|\\Q\\p{L}[\\E|"), std::string::npos) << out;  // untouched
  EXPECT_NE(out.find("[]\\p{N}\\x{"), std::string::npos) << out;  // "]" first in a class is literal
  EXPECT_NE(out.find("\\[[\\p{N}\\x{"), std::string::npos) << out;  // an escaped [ opens no class
  // A Unicode 15 emoji (U+1FAE8) is a symbol and a Unicode 16 hieroglyph (U+134EC) a letter, so
  // they split as in Hugging Face: ["x", "🫨", "y"] and ["a𓓬b"] (PCRE2 alone: ["x", "🫨y"], ["a", "𓓬b"]).
  RegexSplitter splitter;
  splitter.add_step(R"([^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+)", false, "test");
  std::vector<std::string_view> pieces;
  splitter.split("x\U0001FAE8y", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"x", "\U0001FAE8", "y"}));
  pieces.clear();
  splitter.split("a\U000134ECb", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a\U000134ECb"}));
}

// ---- dsv4 tokenize -------------------------------------------------------------------------

TEST(TokenizeCli, EncodesStdinAsOneText) {
  const auto r = test::run_dsv4("tokenize -t " + kFixtureTokenizer, "Hello world!");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "72,101,288,111,261,289,299,33\n");
  const auto prompt = test::run_dsv4(
      "tokenize -t " + kFixtureTokenizer,
      "<｜begin▁of▁sentence｜><｜User｜>Tell me about the lighthouse keeper and his cat.<｜Assistant｜></think>");
  EXPECT_EQ(prompt.out, "496,499,84,101,288,301,101,390,258,309,492,101,339,271,277,294,394,46,500,502\n");
  EXPECT_EQ(test::run_dsv4("tokenize -t " + kFixtureTokenizer, "").out, "\n");
}

TEST(TokenizeCli, JsonlLinesBothWays) {
  const auto enc = test::run_dsv4("tokenize --jsonl -t " + kFixtureTokenizer, "\"Hello world!\"\n\"a\\nb\"\n\"\"\n");
  EXPECT_EQ(enc.exit_code, 0) << enc.err;
  EXPECT_EQ(enc.out, "[72,101,288,111,261,289,299,33]\n[97,10,98]\n[]\n");
  const auto dec = test::run_dsv4("tokenize --jsonl --decode -t " + kFixtureTokenizer, "[72,101,288,111,261,289,299,33]\n[97,10,98]\n[]\n");
  EXPECT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_EQ(dec.out, "\"Hello world!\"\n\"a\\nb\"\n\"\"\n");
  const auto plain = test::run_dsv4("tokenize --decode -t " + kFixtureTokenizer, "72, 101,288\n111");
  EXPECT_EQ(plain.out, "Hello");
}

// --chat: a chat request's prompt as the server encodes it (begin of sentence, the turn's added
// tokens, the non-thinking answer start), one line per request.
TEST(TokenizeCli, ChatRequestsGiveThePromptTheServerPrefills) {
  const std::string request =
      R"({"model": "m", "messages": [{"role": "user", "content": "Tell me about the lighthouse keeper and his cat."}]})";
  const auto r = test::run_dsv4("tokenize --chat -t " + kFixtureTokenizer, request + "\n" + request + "\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string ids = "[496,499,84,101,288,301,101,390,258,309,492,101,339,271,277,294,394,46,500,502]\n";
  EXPECT_EQ(r.out, ids + ids);
}

TEST(TokenizeCli, ErrorsAreOneLineAndExitOne) {
  const auto check = [](const test::CommandResult& r) {
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  };
  check(test::run_dsv4("tokenize -t /nonexistent/tokenizer.json", "x"));
  check(test::run_dsv4("tokenize --jsonl -t " + kFixtureTokenizer, "not json\n"));
  check(test::run_dsv4("tokenize --jsonl -t " + kFixtureTokenizer, "[1,2]\n"));
  check(test::run_dsv4("tokenize --decode -t " + kFixtureTokenizer, "1,x"));
  check(test::run_dsv4("tokenize --decode -t " + kFixtureTokenizer, "600"));
  check(test::run_dsv4("tokenize --jsonl --decode -t " + kFixtureTokenizer, "[1,-2]\n"));
  check(test::run_dsv4("tokenize --jsonl --decode -t " + kFixtureTokenizer, "\"text\"\n"));
  check(test::run_dsv4("tokenize --chat -t " + kFixtureTokenizer, "{\"model\": \"m\"}\n"));
  check(test::run_dsv4("tokenize --chat -t " + kFixtureTokenizer, "[1]\n"));
}

}  // namespace
}  // namespace dsv4::text
