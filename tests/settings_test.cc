// The settings table: did-you-mean for unknown names, and no DSV4_* variable outside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <variant>

#include <stdlib.h>

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
  const std::set<std::string> not_env = {"DSV4_BENCH", "DSV4_FUZZ", "DSV4_SANITIZE", "DSV4_TESTS", "DSV4_WERROR", "DSV4_ENGINE_ONLY", "DSV4_TSAN",
                                         "DSV4_BINARY", "DSV4_SOURCE_DIR", "DSV4_HAVE_VULKAN", "DSV4_VULKAN_STATUS", "DSV4_DEMO_MODEL_DIR", "DSV4_CPU_RELAX", "DSV4_RAMM",
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
  const std::regex declared("add_(option|flag)[_a-z]*[(<]");
  const auto n_declared = std::distance(std::sregex_iterator(main_cc.begin(), main_cc.end(), declared), std::sregex_iterator());
  EXPECT_EQ(n_declared, 3) << "flags must be declared through Bindings::add(cmd, key, target) with a settings key";
  std::set<std::string> keys;
  for (const Setting& s : all_settings()) {
    EXPECT_TRUE(keys.insert(s.key).second) << "duplicate key " << s.key;
    EXPECT_FALSE(s.help.empty()) << s.key;
    if (!s.flag.empty()) {
      EXPECT_NE(main_cc.find("\"" + s.key + "\""), std::string::npos) << s.flag << " (" << s.key << ") is offered by no command";
    }
  }
}

// Every default `dsv4 settings` prints is accepted by the setting's own parser and means the
// typed default (this is what caught `--ram auto` and `DSV4_KERNELS=auto` being refused).
TEST(Settings, EveryPrintedDefaultParsesBackToItself) {
  const std::string printed = describe_settings();
  int parsed = 0;
  for (const Setting& s : all_settings()) {
    const std::string text = format_setting_value(s, s.fallback);
    if (std::holds_alternative<std::monostate>(s.fallback)) {
      EXPECT_EQ(text, "-") << s.key;
      continue;
    }
    EXPECT_NE(printed.find(" " + text + " "), std::string::npos) << s.key << ": " << text;
    const std::string source = s.flag.empty() ? s.env : s.flag_name();
    SettingValue back;
    ASSERT_NO_THROW(back = parse_setting(s, text, source)) << s.key << ": \"" << text << "\"";
    EXPECT_TRUE(back == s.fallback) << s.key << ": \"" << text << "\" parsed to something else";
    ++parsed;
  }
  EXPECT_GT(parsed, 50);
}

// What a value must look like, exactly: no silent saturation, no trailing junk, the range
// checked; the error names the flag or the variable the user wrote.
TEST(Settings, ValuesParseExactlyOrAreRefusedNamingTheSource) {
  auto refused = [](const char* key, const char* text, const char* source) {
    try {
      parse_setting(setting(key), text, source);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const char* bad : {"-1", "18446744073709551616", "1e23", "2^64", " 1", "1 ", "+1", "0x10", ""})
    EXPECT_NE(refused("seed", bad, "--seed").find("--seed \""), std::string::npos) << bad;
  EXPECT_EQ(refused("seed", "18446744073709551615", "--seed"), "accepted");
  EXPECT_EQ(refused("max_tokens", "abc", "DSV4_MAX_TOKENS"),
            "DSV4_MAX_TOKENS=abc: expected a whole number from 0 to 1073741824");
  EXPECT_NE(refused("threads", "1025", "--threads").find("from 0 to 1024"), std::string::npos);
  EXPECT_NE(refused("temperature", "nan", "--temperature").find("--temperature"), std::string::npos);
  EXPECT_NE(refused("temperature", "inf", "--temperature").find("--temperature"), std::string::npos);
  EXPECT_NE(refused("top_p", "0", "--top-p").find("above 0 and at most 1"), std::string::npos);
  EXPECT_EQ(refused("top_p", "0.5", "--top-p"), "accepted");
  EXPECT_NE(refused("numerics", "fastest", "--numerics").find("one of reference, fast"), std::string::npos);
  EXPECT_NE(refused("kernels", "sse9", "DSV4_KERNELS").find("auto, scalar, avx2, avxvnni, avx512"), std::string::npos);
  EXPECT_NE(refused("ram", "12Q", "--ram").find("--ram"), std::string::npos);
  EXPECT_EQ(refused("ram", "auto", "--ram"), "accepted");
  EXPECT_NE(refused("kernels_n", "1,,2", "--n").find("--n"), std::string::npos);
  EXPECT_TRUE(parse_setting(setting("kernels_n"), "1,16", "--n") == SettingValue(std::vector<int64_t>{1, 16}));
  EXPECT_NE(refused("kernels_format", "fp4,fp5", "--format").find("--format"), std::string::npos);
  EXPECT_NE(refused("tokens", "1,-2", "--tokens").find("--tokens"), std::string::npos);
  EXPECT_NE(refused("synth_shard_size", "1.5", "--shard-size").find("--shard-size"), std::string::npos);
  EXPECT_TRUE(parse_setting(setting("synth_shard_size"), "64M", "--shard-size") == SettingValue(uint64_t{64} << 20));
}

// The command line end to end: the advertised defaults work when given, bad values and
// mistyped commands are one line naming what the user wrote, exit 2.
TEST(Settings, TheCommandLineRefusesWhatDoesNotParse) {
  test::TempDir tmp;
  const std::string model = test::fixture("tiny-a");
  ::setenv("DSV4_MAX_TOKENS", "abc", 1);  // inherited by the child
  test::CommandResult r = test::run_dsv4("run -m " + model + " --raw hi");
  ::unsetenv("DSV4_MAX_TOKENS");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "dsv4: error: DSV4_MAX_TOKENS=abc: expected a whole number from 0 to 1073741824\n");
  ::setenv("DSV4_KERNELS", "auto", 1);
  r = test::run_dsv4("generate -m " + model + " --tokens 1,2,3 -n 2 --ram auto");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ::unsetenv("DSV4_KERNELS");
  r = test::run_dsv4("run -m " + model + " --raw --seed -1 hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--seed \"-1\": expected a whole number from 0 to 18446744073709551615"), std::string::npos)
      << r.err;
  r = test::run_dsv4("run -m " + model + " --raw --seed 1e23 hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--seed \"1e23\""), std::string::npos) << r.err;
  r = test::run_dsv4("rnu hello");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command \"rnu\" (did you mean run?"), std::string::npos) << r.err;
  r = test::run_dsv4("bench kernel");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean kernels?"), std::string::npos) << r.err;
  test::write_file(tmp / "file", "x");
  r = test::run_dsv4("generate -m " + (tmp / "file") + " --tokens 1 -n 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is a file, not a checkpoint directory"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dsv4
