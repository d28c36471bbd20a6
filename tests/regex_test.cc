// Patterns and formats as byte automata: against std::regex (ECMAScript) as an independent
// oracle on ASCII texts, by hand for UTF-8, the formats, and the products.
#include "dsv4/constrain/regex.h"

#include <random>
#include <regex>

#include <gtest/gtest.h>

namespace dsv4::constrain {
namespace {

// Every state can still reach an accepting one.
bool trimmed(const ByteDfa& d) {
  for (uint32_t s = 0; s < d.size(); ++s) {
    std::vector<uint8_t> seen(d.size(), 0);
    std::vector<uint32_t> todo = {s};
    seen[s] = 1;
    bool found = false;
    while (!todo.empty() && !found) {
      const uint32_t t = todo.back();
      todo.pop_back();
      found = d.accept[t] != 0;
      for (int b = 0; b < 256; ++b) {
        const uint32_t u = d.step(t, uint8_t(b));
        if (u != ByteDfa::kDead && !seen[u]) seen[u] = 1, todo.push_back(u);
      }
    }
    if (!found) return false;
  }
  return true;
}

TEST(Regex, AgreesWithStdRegexOnAsciiTexts) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"abc", "abcx"},          {"^abc$", "abc"},           {"^a+b*$", "ab"},
      {"^(foo|bar)+$", "fobar"}, {"^[a-c]{2,3}$", "abcd"},  {"^\\d{3}-\\d{4}$", "0129-"},
      {"x|^y$", "xy"},          {"^[^0-9]*$", "a1b"},       {"^.{2}$", "ab\n"},
      {"a?b?c?", "abc"},        {"^(ab|a)(bc|c)?$", "abc"}, {"[A-Z][a-z]+", "Abz"},
      {"^\\w+@\\w+\\.c$", "a@.c_"}, {"^\\s*$", " \t\na"}, {"^(?:a|b){0,3}$", "ab"},
      {"colou?r", "colour"},    {"^[\\-+]?\\d+(\\.\\d+)?$", "-1.5+"}, {"^[a-z-]+$", "a-z"},
      {"^\\S+$", "a b"},        {"^a{2}b{1,}c{0,2}$", "aabcc"}, {"^(?:ab)+?$", "abab"},
      {"^[\\d\\s]+$", "1 2a"},  {"^\\x41\\u0042[\\x43-\\x45]$", "ABCE"}, {"^a|b|c$", "abc"},
      {"(x|y)*z", "xyz"},       {"^[.]$", ".a"},            {"^\\.\\*\\+\\?$", ".*+?"},
      {"^[^\\n]*$", "a\nb"},
  };
  std::mt19937 rng(7);
  for (const auto& [pattern, alphabet] : cases) {
    SCOPED_TRACE(pattern);
    const ByteDfa d = regex_dfa(pattern);
    EXPECT_TRUE(trimmed(d));
    const std::regex oracle(pattern, std::regex::ECMAScript);
    int agreed = 0, matched = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string text;
      const int len = int(rng() % 9);
      for (int k = 0; k < len; ++k) text += alphabet[rng() % alphabet.size()];
      const bool want = std::regex_search(text, oracle);
      ASSERT_EQ(full_match(d, text), want) << "text \"" << text << "\"";
      ++agreed;
      matched += want;
    }
    EXPECT_EQ(agreed, 3000);
    EXPECT_GT(matched, 0);  // the alphabet reaches matching texts
  }
}

TEST(Regex, Utf8CodePoints) {
  const ByteDfa cyrillic = regex_dfa("^[а-я]+$");
  EXPECT_TRUE(full_match(cyrillic, "привет"));
  EXPECT_FALSE(full_match(cyrillic, "hello"));
  EXPECT_FALSE(full_match(cyrillic, ""));
  const ByteDfa one = regex_dfa("^.$");
  EXPECT_TRUE(full_match(one, "é"));
  EXPECT_TRUE(full_match(one, "😀"));
  EXPECT_TRUE(full_match(one, "a"));
  EXPECT_FALSE(full_match(one, "ab"));
  EXPECT_FALSE(full_match(one, "\xC3"));      // half a character
  EXPECT_FALSE(full_match(one, "\xED\xA0\x80"));  // an encoded surrogate is not a character
  const ByteDfa astral = regex_dfa("^\\u{1F600}\\uD83D\\uDE01$");
  EXPECT_TRUE(full_match(astral, "😀😁"));
  EXPECT_TRUE(full_match(regex_dfa("^(?<word>ab)+$"), "abab"));  // a named group (std::regex has none)
  const ByteDfa not_ascii = regex_dfa("^[^a-z]$");
  EXPECT_TRUE(full_match(not_ascii, "ж"));
  EXPECT_FALSE(full_match(not_ascii, "q"));
  EXPECT_TRUE(trimmed(not_ascii));
}

TEST(Regex, RefusesWhatItCannotEnforceByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreference \\1"},   {"(?<x>a)\\k<x>", "backreference \\k<"},
      {"(?=a)a", "look-ahead"},          {"(?<!a)b", "look-behind"},
      {"\\bword", "word boundary \\b"},  {"a^b", "anchor ^"},
      {"a$b", "anchor $"},               {"(a", "not closed"},
      {"[a", "not closed"},              {"a{2,1}", "reversed"},
      {"*a", "nothing to repeat"},       {"a)", "unbalanced"},
      {"\\q", "unknown escape"},         {"[]", "matches no string"},
      {"a{1001}", "above 1000"},
  };
  for (const auto& [pattern, message] : cases) {
    try {
      regex_dfa(pattern);
      ADD_FAILURE() << pattern << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << pattern << ": " << e.what();
    }
  }
  EXPECT_THROW(regex_dfa("(a|b)*a(a|b){16}"), Error);  // 2^17 states: too complex
}

TEST(Regex, Formats) {
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> cases = {
      {"date", {"2024-02-29", "2000-02-29", "1999-12-31", "2023-04-30"},
       {"2023-02-29", "1900-02-29", "2023-13-01", "2023-04-31", "2023-1-01", "20230101"}},
      {"time", {"23:59:59Z", "00:00:00.123+05:30", "12:30:00z"}, {"24:00:00Z", "12:60:00Z", "12:30:00", "12:30Z"}},
      {"date-time", {"2024-02-29T12:00:00Z", "1999-12-31t23:59:59.5-08:00"}, {"2024-02-29 12:00:00Z", "2024-02-29T12:00Z"}},
      {"duration", {"P3Y6M4DT12H30M5S", "PT0S", "P1W", "P1D", "PT5M"}, {"P", "PT", "P1H", "3Y", "P1DT"}},
      {"email", {"a.b+c@example.com", "x@y"}, {"@example.com", "a@", "a b@c.d", "a..b@c.d"}},
      {"hostname", {"example.com", "a-b.c", "localhost"}, {"-a.com", "a-.com", "a..b", std::string(64, 'a'), std::string(200, 'a').insert(60, ".").insert(120, ".").insert(180, ".") + ".abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789"}},
      {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255"}, {"256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4."}},
      {"ipv6", {"::1", "::", "2001:db8::ff00:42:8329", "fe80:0:0:0:0:0:0:1"}, {"1::2::3", "12345::1", ":1", "1:2:3:4:5:6:7:8:9"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
      {"uri", {"https://example.com/a?b=c#d", "mailto:a@b.c", "urn:isbn:0451450523", "file:///etc/passwd"},
       {"example.com", "/relative", "ht tp://x", "http://a b"}},
      {"uri-reference", {"/a/b", "../x?y", "https://example.com", "", "#frag"}, {"a b", "http://[", "%zz"}},
  };
  for (const auto& [format, good, bad] : cases) {
    SCOPED_TRACE(format);
    ASSERT_TRUE(known_format(format));
    const ByteDfa d = format_dfa(format);
    EXPECT_TRUE(trimmed(d));
    for (const std::string& t : good) EXPECT_TRUE(full_match(d, t)) << t;
    for (const std::string& t : bad) EXPECT_FALSE(full_match(d, t)) << t;
  }
  EXPECT_FALSE(known_format("int64"));
  EXPECT_FALSE(known_format("password"));
}

TEST(Regex, Products) {
  const ByteDfa as = bound_length(regex_dfa("^a*$"), 2, 3);
  EXPECT_FALSE(full_match(as, "a"));
  EXPECT_TRUE(full_match(as, "aa"));
  EXPECT_TRUE(full_match(as, "aaa"));
  EXPECT_FALSE(full_match(as, "aaaa"));
  const ByteDfa at_least = bound_length(regex_dfa("^.*$"), 2, UINT32_MAX);
  EXPECT_FALSE(full_match(at_least, "é"));  // one code point, two bytes
  EXPECT_TRUE(full_match(at_least, "éé"));
  EXPECT_TRUE(full_match(at_least, std::string(300, 'x')));
  EXPECT_TRUE(trimmed(at_least));
  EXPECT_EQ(bound_length(regex_dfa("^\\d{4}$"), 5, 9).start, ByteDfa::kDead);  // no length fits both
  const ByteDfa no_ab = excluding(regex_dfa("^.*$"), "ab");
  EXPECT_FALSE(full_match(no_ab, "xaby"));
  EXPECT_TRUE(full_match(no_ab, "xa"));
  EXPECT_TRUE(full_match(no_ab, "ba"));
  EXPECT_TRUE(full_match(no_ab, "aac"));
  const ByteDfa both = intersect(format_dfa("ipv4"), regex_dfa("^10\\."));
  EXPECT_TRUE(full_match(both, "10.0.0.1"));
  EXPECT_FALSE(full_match(both, "11.0.0.1"));
  EXPECT_EQ(writable_in_json(regex_dfa("^\\x01$")).start, ByteDfa::kDead);
  const ByteDfa tabs = writable_in_json(regex_dfa("^[\\x00-\\x1f]+$"));
  EXPECT_TRUE(full_match(tabs, "\t\n"));
  EXPECT_FALSE(full_match(tabs, "\x01"));
}

}  // namespace
}  // namespace dsv4::constrain

namespace dsv4::constrain {
namespace {

TEST(Regex, IntegerRangesMatchExactlyTheirIntegers) {
  std::mt19937_64 rng(3);
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 0}, {0, 9}, {1, 150}, {7, 7}, {10, 99}, {19, 2021}, {0, 999999999999999}, {123456, 987654321}, {99, 100}};
  for (const auto& [lo, hi] : ranges) {
    SCOPED_TRACE(std::to_string(lo) + ".." + std::to_string(hi));
    const ByteDfa d = regex_dfa("^(?:" + integer_range_pattern(lo, hi) + ")$");
    std::vector<uint64_t> probes = {lo, hi, lo + 1, hi + 1, lo > 0 ? lo - 1 : 0, hi > 0 ? hi - 1 : 0, 0, 1, 10, 100};
    for (int i = 0; i < 300; ++i) probes.push_back(rng() % (hi + 2 + hi / 2));
    for (uint64_t v : probes) EXPECT_EQ(full_match(d, std::to_string(v)), v >= lo && v <= hi) << v;
    EXPECT_FALSE(full_match(d, "0" + std::to_string(lo)));  // no leading zeros
    EXPECT_FALSE(full_match(d, "-" + std::to_string(lo)));
  }
}

}  // namespace
}  // namespace dsv4::constrain
