// The C++ tokenizer against the official Hugging Face implementation (npm "tokenizers" 0.23.2,
// the Rust core), live: tests/node/tokenizer_oracle.js generates adversarial inputs from a fixed
// seed, tokenizes and decodes them with Hugging Face, and this test requires identical ids,
// identical decoded text, decode(encode(s)) == s (after the documented U+FFFD repair of invalid
// UTF-8), and a streaming decode equal to the one-shot decode.
//
// Needs node and the npm packages that scripts/setup.sh installs into tests/node/node_modules; a
// missing oracle is a test failure, not a skip. DSV4_TOK_ORACLE_SEED overrides the seed.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dsv4/text/pre_tokenizer.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/text/utf8.h"
#include "test_util.h"

namespace dsv4::text {
namespace {

constexpr const char* kOracle = "tests/node/tokenizer_oracle.js";

std::string run(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + command);
  std::string out;
  char buffer[1 << 16];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("command failed (is node installed and scripts/setup.sh run?): " + command + "\n" + out);
  return out;
}

std::string unhex(const std::string& hex) {
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<TokenId> parse_ids(const std::string& s) {
  std::vector<TokenId> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) ids.push_back(static_cast<TokenId>(std::stol(item)));
  return ids;
}

std::string show(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  return out;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    fields.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return fields;
    start = tab + 1;
  }
}

uint32_t seed_or(uint32_t fallback) {
  const char* s = std::getenv("DSV4_TOK_ORACLE_SEED");
  return s ? static_cast<uint32_t>(std::stoul(s)) : fallback;
}

struct Tally {
  size_t strings = 0, id_mismatches = 0, decode_mismatches = 0, round_trip_failures = 0, stream_mismatches = 0;
  size_t decode_sequences = 0, sequence_mismatches = 0;
  std::vector<std::string> examples;
  void note(const std::string& what) {
    if (examples.size() < 8) examples.push_back(what);
  }
};

Tally compare(const Tokenizer& tok, const std::string& oracle_output) {
  Tally t;
  std::stringstream in(oracle_output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto f = split_tabs(line);
    if (f[0] == "E" && f.size() == 4) {
      ++t.strings;
      const std::string input = unhex(f[1]);
      const auto expected = parse_ids(f[2]);
      const auto ids = tok.encode(input);
      if (ids != expected) {
        ++t.id_mismatches;
        t.note(fmt::format("ids of \"{}\": got [{}], HF [{}]", show(input), fmt::join(ids, ","), fmt::join(expected, ",")));
      }
      const std::string decoded = tok.decode(ids);
      if (decoded != unhex(f[3])) {
        ++t.decode_mismatches;
        t.note(fmt::format("decode of \"{}\": got \"{}\", HF \"{}\"", show(input), show(decoded), show(unhex(f[3]))));
      }
      if (decoded != to_valid_utf8(input)) {
        ++t.round_trip_failures;
        t.note(fmt::format("round trip of \"{}\" gave \"{}\"", show(input), show(decoded)));
      }
      IncrementalDecoder stream(tok);
      std::string streamed;
      for (TokenId id : ids) streamed += stream.push(id);
      streamed += stream.finish();
      if (streamed != decoded) ++t.stream_mismatches;
    } else if (f[0] == "D" && f.size() == 4) {
      ++t.decode_sequences;
      const auto ids = parse_ids(f[1]);
      const std::string plain = tok.decode(ids), skipped = tok.decode(ids, /*skip_special=*/true);
      IncrementalDecoder stream(tok);
      std::string streamed;
      for (TokenId id : ids) {
        const std::string piece = stream.push(id);
        if (!is_valid_utf8(piece)) ++t.stream_mismatches;
        streamed += piece;
      }
      streamed += stream.finish();
      if (plain != unhex(f[2]) || skipped != unhex(f[3]) || streamed != plain) {
        ++t.sequence_mismatches;
        t.note(fmt::format("decode of [{}]: got \"{}\", HF \"{}\"", f[1], show(plain), show(unhex(f[2]))));
      }
    } else {
      ADD_FAILURE() << "unexpected oracle line: " << line.substr(0, 200);
    }
  }
  return t;
}

// `round_trip`: whether decode(encode(s)) == s must hold. It does for real tokenizers; the
// synthetic variants deliberately declare added tokens whose text is a byte-level spelling
// ("é" is also the vocab key of byte 0xE9), which Hugging Face decodes to other bytes.
void check(const std::string& name, const std::string& tokenizer_path, uint32_t seed, int count, size_t min_strings,
           bool round_trip = true) {
  const Tokenizer tok = Tokenizer::from_file(tokenizer_path);
  const std::string output = run(fmt::format("node {} cases '{}' {} {}", kOracle, tokenizer_path, seed, count));
  const Tally t = compare(tok, output);
  std::printf("[oracle %s] seed %u: %zu strings, %zu id mismatches, %zu decode mismatches, %zu round-trip failures, "
              "%zu stream mismatches; %zu random id sequences, %zu decode mismatches\n",
              name.c_str(), seed, t.strings, t.id_mismatches, t.decode_mismatches, t.round_trip_failures,
              t.stream_mismatches, t.decode_sequences, t.sequence_mismatches);
  for (const auto& e : t.examples) std::printf("  %s\n", e.c_str());
  EXPECT_GE(t.strings, min_strings);
  EXPECT_GE(t.decode_sequences, min_strings / 10);
  EXPECT_EQ(t.id_mismatches, 0u);
  EXPECT_EQ(t.decode_mismatches, 0u);
  if (round_trip) {
    EXPECT_EQ(t.round_trip_failures, 0u);
  }
  EXPECT_EQ(t.stream_mismatches, 0u);
  EXPECT_EQ(t.sequence_mismatches, 0u);
}

TEST(TokOracle, RealDeepSeekV3TokenizerTenThousandStrings) {
  std::string path = run(fmt::format("node {} v3-path", kOracle));
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  check("deepseek-v3", path, seed_or(20260501), 10000, 10000);
}

// Spec §5.1: ordinary text has the same ids in V3 and V4; specials are found by text and the
// config names BOS/EOS (the V3 tokenizer_config.json beside the file: bos 0, eos 1).
TEST(TokOracle, RealDeepSeekV3SpecialTokensAndSpecIds) {
  std::string path = run(fmt::format("node {} v3-path", kOracle));
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  const Tokenizer tok = Tokenizer::from_file(path);
  EXPECT_EQ(tok.vocab_size(), 128815);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.token_id("<｜▁pad▁｜>"), 2);
  EXPECT_EQ(tok.token_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok.token_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok.encode("<｜User｜>你好<｜Assistant｜>"), (std::vector<TokenId>{128803, 30594, 128804}));
  EXPECT_EQ(tok.encode("推理"), std::vector<TokenId>{36101});
  EXPECT_EQ(tok.encode("答案<｜end▁of▁sentence｜>"), (std::vector<TokenId>{7624, 1}));
  EXPECT_EQ(tok.encode("Hello"), std::vector<TokenId>{19923});
  EXPECT_EQ(tok.encode("!"), std::vector<TokenId>{3});
  EXPECT_EQ(tok.encode("Hello, world! <｜User｜>hi"), (std::vector<TokenId>{19923, 14, 2058, 3, 223, 128803, 6366}));
}

TEST(TokOracle, FixtureTokenizer) {
  check("tiny-a", test::fixture("tiny-a/tokenizer.json"), seed_or(7), 3000, 3000);
}

// The built-in demo model's own tokenizer (tools/demo_model/bpe.py): 3824 merges learned on
// the King James Bible, specials at the top ids. Its training ids came from the C++ tokenizer,
// so Hugging Face must agree with it too. Also some of the held-out text it ships with.
TEST(TokOracle, DemoModelTokenizer) {
  check("demo", "models/demo/tokenizer.json", seed_or(14), 3000, 3000);
  const Tokenizer tok = Tokenizer::from_file("models/demo/tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(tok.bos_id(), 4080);
  EXPECT_EQ(tok.eos_id(), 4081);
  EXPECT_EQ(tok.token_id("<｜User｜>"), 4083);
  EXPECT_EQ(tok.token_id("</think>"), 4086);
}

TEST(TokOracle, SyntheticVariants) {
  test::TempDir dir;
  for (const char* variant : {"added_tokens", "ignore_merges"}) {
    const std::string path = dir / (std::string(variant) + ".json");
    run(fmt::format("node {} variant '{}' '{}' {}", kOracle, test::fixture("tiny-a/tokenizer.json"), path, variant));
    check(variant, path, seed_or(11), 2000, 2000, /*round_trip=*/false);
  }
}

// Every code point of planes 0-3 and 14, category by category: the classes PCRE2 sees (Unicode 14
// tables widened by unicode_delta.inc) must be exactly Hugging Face's (Oniguruma, Unicode 16).
TEST(TokOracle, UnicodeCategoriesMatchOnigurumaForEveryCodePoint) {
  const auto oracle = nlohmann::json::parse(run(fmt::format("node tests/node/unicode_probe.js '{}' all", test::fixture("tiny-a/tokenizer.json"))));
  std::string text;
  for (char32_t c = 0; c <= 0xEFFFF; ++c) {
    if ((c > 0x3FFFF && c < 0xE0000) || (c >= 0xD800 && c <= 0xDFFF) || c == 1) continue;
    text += '\x01';
    append_utf8(c, text);
  }
  for (const char* category : {"L", "M", "N", "P", "S", "Nd", "Z"}) {
    RegexSplitter splitter;
    splitter.add_step(fmt::format("\\p{{{}}}", category), false, "test");
    std::vector<std::string_view> pieces;
    splitter.split(text, pieces);
    std::vector<uint32_t> mine;
    for (std::string_view piece : pieces) {
      if (piece == "\x01") continue;
      size_t i = 0;
      const char32_t c = next_code_point(piece, i);
      if (i == piece.size()) mine.push_back(static_cast<uint32_t>(c));
    }
    const auto expected = oracle[category].get<std::vector<uint32_t>>();
    EXPECT_GT(expected.size(), 10u) << category;
    EXPECT_EQ(mine.size(), expected.size()) << category;
    std::vector<uint32_t> only_mine, only_hf;
    std::set_difference(mine.begin(), mine.end(), expected.begin(), expected.end(), std::back_inserter(only_mine));
    std::set_difference(expected.begin(), expected.end(), mine.begin(), mine.end(), std::back_inserter(only_hf));
    EXPECT_TRUE(only_mine.empty() && only_hf.empty())
        << "\\p{" << category << "}: " << only_mine.size() << " code points only in PCRE2 (first U+"
        << fmt::format("{:04X}", only_mine.empty() ? 0 : only_mine[0]) << "), " << only_hf.size()
        << " only in Hugging Face (first U+" << fmt::format("{:04X}", only_hf.empty() ? 0 : only_hf[0]) << ")";
  }
}

}  // namespace
}  // namespace dsv4::text
