// The built-in demo model (models/demo, trained by tools/demo_model): run/chat/serve use it
// without -m, with no generation step, and it writes English. (Its logits against the
// trainer's own torch forward are the demo_model_torch_vs_engine test.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace dsv4 {
namespace {

using test::run_dsv4;

const std::string kPrompt = "\"Tell me about the lighthouse keeper and his cat.\"";

// A HOME with nothing in it, so nothing can come from (or be written to) ~/.cache.
class DemoModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* h = std::getenv("HOME");
    old_home_ = h ? h : "";
    setenv("HOME", home_.path().c_str(), 1);
    unsetenv("DSV4_DEMO_DIR");
  }
  void TearDown() override { setenv("HOME", old_home_.c_str(), 1); }
  test::TempDir home_;
  std::string old_home_;
};

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  const std::regex word("[A-Za-z]+");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator(); ++it)
    out.push_back(it->str());
  return out;
}

std::set<std::string> dictionary() {
  std::ifstream in("/usr/share/dict/words");  // Debian wamerican, installed by scripts/setup.sh
  std::set<std::string> d;
  std::string w;
  while (std::getline(in, w)) {
    for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    d.insert(w);
  }
  return d;
}

// Share of alphabetic tokens that are dictionary words (case-insensitive; "LORD's" counts its
// parts), and the count of the most repeated 6-word sequence.
struct Wordiness {
  size_t words = 0;
  double dictionary_share = 0;
  int max_6gram_repeats = 0;
};

Wordiness wordiness(const std::string& text) {
  static const std::set<std::string> dict = dictionary();
  Wordiness r;
  const std::vector<std::string> w = words_of(text);
  r.words = w.size();
  size_t known = 0;
  for (std::string s : w) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    known += dict.count(s) || s.size() == 1;
  }
  r.dictionary_share = w.empty() ? 0 : double(known) / double(w.size());
  std::map<std::string, int> grams;
  for (size_t i = 0; i + 6 <= w.size(); ++i) {
    std::string g;
    for (size_t j = i; j < i + 6; ++j) g += w[j] + " ";
    r.max_6gram_repeats = std::max(r.max_6gram_repeats, ++grams[g]);
  }
  return r;
}

TEST_F(DemoModel, RunWithoutModelFlagUsesTheShippedModelAndWritesEnglish) {
  ASSERT_GT(dictionary().size(), 50000u) << "/usr/share/dict/words missing: run scripts/setup.sh (wamerican)";
  for (int seed : {1, 2, 3}) {
    auto r = run_dsv4("run --max-tokens 64 --seed " + std::to_string(seed) + " " + kPrompt, "", 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("built-in demo model in "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("models/demo"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("creating"), std::string::npos) << r.err;
    const Wordiness w = wordiness(r.out);
    EXPECT_GE(w.words, 15u) << r.out;
    EXPECT_GE(w.dictionary_share, 0.9) << r.out;
    EXPECT_LE(w.max_6gram_repeats, 2) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(home_ / ".cache")) << "the demo model must not be generated";
}

TEST_F(DemoModel, RawContinuationWritesEnglish) {
  auto r = run_dsv4("run --raw --max-tokens 64 --seed 7 \"And it came to pass\"", "", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Wordiness w = wordiness(r.out);
  EXPECT_GE(w.words, 15u) << r.out;
  EXPECT_GE(w.dictionary_share, 0.9) << r.out;
  EXPECT_LE(w.max_6gram_repeats, 2) << r.out;
}

// A schema whose shortest answer does not fit --max-tokens: one clear error line, non-zero
// exit (at the minimum the answer is complete: constrain_generation_test, server_test).
TEST_F(DemoModel, JsonSchemaBelowItsMinimumSizeIsOneErrorLine) {
  test::write_file(home_ / "s.json", R"({"type": "object", "properties": {"city": {"type": "string", "minLength": 3}},
      "required": ["city"], "additionalProperties": false})");
  auto r = run_dsv4("run --json-schema " + home_ / "s.json" + " --max-tokens 5 Weather", "", 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("error: --max-tokens 5 is too small for"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("takes 14 tokens"), std::string::npos) << r.err;  // {"city":"aaa"}
  EXPECT_EQ(r.out, "");
}

TEST_F(DemoModel, ChatKeepsTheSessionAcrossTurns) {
  auto r = run_dsv4("chat --max-tokens 24 --seed 5", "Hello!\nTell me about the sea.\n/exit\n", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GE(words_of(r.out).size(), 10u) << r.out;
}

TEST_F(DemoModel, InspectListsEveryBlock) {
  auto r = run_dsv4("inspect models/demo", "", 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"SWA", "CSA ratio 4", "HCA ratio 128", "hash (tid2eid)", "top-k + bias", "mtp.0",
                           "mtp         yes", "3 hash layers", "mHC 4 streams"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
}

// The shipped files: within the size budget, and the chat encoding the model was trained on.
TEST_F(DemoModel, FilesAndChatEncoding) {
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator("models/demo")) bytes += e.file_size();
  EXPECT_LE(bytes, 40ull << 20);
  auto r = run_dsv4("run --json --max-tokens 1 --temperature 0 \"Hello!\"", "", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  auto t = run_dsv4("tokenize -t models/demo/tokenizer.json",
                    "<｜begin▁of▁sentence｜><｜User｜>Hello!<｜Assistant｜></think>");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  std::string ids;
  for (auto& id : j["prompt_tokens"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  EXPECT_EQ(ids + "\n", t.out);
}

}  // namespace
}  // namespace dsv4
