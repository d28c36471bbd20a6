// The settings table: did-you-mean for unknown names, and no DSV4_* variable outside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>

#include "dsv4/runtime/settings.h"
#include "dsv4/util/error.h"
#include "test_util.h"

namespace dsv4 {
namespace {

TEST(Settings, UnknownEnvironmentGetsASuggestion) {
  std::string a = "DSV4_RAMM=8G", b = "DSV4_THREADS=2", c = "PATH=/bin", d = "DSV4_ZZZZZZZZZZ=1";
  char* env[] = {a.data(), b.data(), c.data(), d.data(), nullptr};
  std::vector<std::string> problems = unknown_environment(env);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0], "unknown environment variable DSV4_RAMM (did you mean DSV4_RAM?)");
  EXPECT_EQ(problems[1], "unknown environment variable DSV4_ZZZZZZZZZZ");
  EXPECT_EQ(closest_match("--temprature", {"--temperature", "--top-p"}), "--temperature");
  EXPECT_EQ(setting("ram").env, "DSV4_RAM");
  EXPECT_THROW(setting("no-such-setting"), Error);
}

// Every DSV4_* environment variable the code or scripts read must be in the table, or the
// binary would reject it as unknown when a user (or the test suite) sets it.
TEST(Settings, EveryVariableInTheSourceIsRegistered) {
  // CMake options, compile definitions and deliberate typos in tests are not variables.
  const std::set<std::string> not_env = {"DSV4_BENCH", "DSV4_FUZZ", "DSV4_SANITIZE", "DSV4_TESTS", "DSV4_WERROR",
                                         "DSV4_BINARY", "DSV4_SOURCE_DIR", "DSV4_CPU_RELAX", "DSV4_RAMM",
                                         "DSV4_TEMPRATURE", "DSV4_ZZZZZZZZZZ", "DSV4_"};
  std::set<std::string> known;
  for (const Setting& s : all_settings())
    if (!s.env.empty()) known.insert(s.env);
  const std::regex name("DSV4_[A-Z0-9_]*");
  const std::regex macro("#\\s*define\\s+(DSV4_[A-Z0-9_]*)");
  std::vector<std::pair<std::string, std::string>> texts;  // path, contents
  for (const char* dir : {"src", "tests", "scripts", "fuzz"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      const std::string path = e.path().string();
      if (!e.is_regular_file() || path.find("node_modules") != std::string::npos) continue;
      const std::string ext = e.path().extension().string();
      if (ext != ".cc" && ext != ".h" && ext != ".sh" && ext != ".js" && ext != ".mjs" && ext != "") continue;
      texts.emplace_back(path, test::read_file(path));
    }
  }
  std::set<std::string> macros;  // preprocessor macros are not variables
  for (const auto& [path, text] : texts)
    for (std::sregex_iterator it(text.begin(), text.end(), macro), end; it != end; ++it) macros.insert((*it)[1]);
  const int files = static_cast<int>(texts.size());
  for (const auto& [path, text] : texts) {
    for (std::sregex_iterator it(text.begin(), text.end(), name), end; it != end; ++it) {
      const std::string var = it->str();
      EXPECT_TRUE(known.count(var) || not_env.count(var) || macros.count(var))
          << var << " used in " << path << " is not in the settings table";
    }
  }
  EXPECT_GT(files, 20);
}


// main.cc builds the command line only from the table: no flag is declared anywhere else, and
// every flag in the table is offered by some command.
TEST(Settings, EveryFlagComesFromTheTable) {
  const std::string main_cc = test::read_file("src/dsv4/cli/main.cc");
  const std::regex declared("add_(option|flag)\\(");
  const auto n_declared = std::distance(std::sregex_iterator(main_cc.begin(), main_cc.end(), declared), std::sregex_iterator());
  EXPECT_EQ(n_declared, 2) << "flags must be declared through add(cmd, key, target) with a settings key";
  std::set<std::string> keys;
  for (const Setting& s : all_settings()) {
    EXPECT_TRUE(keys.insert(s.key).second) << "duplicate key " << s.key;
    EXPECT_FALSE(s.help.empty()) << s.key;
    EXPECT_FALSE(s.type.empty()) << s.key;
    if (!s.flag.empty()) {
      EXPECT_NE(main_cc.find("\"" + s.key + "\""), std::string::npos) << s.flag << " (" << s.key << ") is offered by no command";
    }
  }
}

}  // namespace
}  // namespace dsv4
