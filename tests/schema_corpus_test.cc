// The schema corpus (tests/schema_corpus: the JSON Schema Test Suite's keyword tests and
// SchemaStore's real-world schemas with their test files; scripts/make_schema_corpus.py):
// every schema that compiles must reject every instance the source marks invalid (the grammar
// only ever produces valid answers), and the share of valid instances it accepts, and of schemas
// it compiles, is reported (the grammar generates a subset of the valid texts: properties in
// the declared order, no \u escapes in patterns, …; docs/constrained-decoding.md).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "grammar_util.h"
#include "test_util.h"

namespace dsv4::constrain {
namespace {

// Entries whose invalid instances are invalid only under an assertion the compiler treats as an
// annotation, as JSON Schema 2020-12 does by default (counted apart).
const std::map<std::string, const char*>& annotation_dependent() {
  static const std::map<std::string, const char*> m = {
      {"schemastore/madge", "format \"regex\" (an ECMA-262 pattern's syntax is not a regular language)"}};
  return m;
}

struct Tally {
  int schemas = 0, compiled = 0, valid = 0, valid_accepted = 0, invalid = 0, invalid_rejected = 0, apart = 0;
  std::map<std::string, int> refused_by;  // keyword (or the message's start) -> schemas
};

void run_corpus(const std::string& file, Tally& t, std::vector<std::string>& unsound) {
  std::ifstream in(std::string(DSV4_SOURCE_DIR) + "/tests/schema_corpus/" + file);
  ASSERT_TRUE(in) << file;
  std::string line;
  while (std::getline(in, line)) {
    const Json entry = Json::parse(line);
    ++t.schemas;
    std::optional<Grammar> g;
    try {
      g = content_grammar(entry["schema"]);
    } catch (const SchemaError& e) {
      ++t.refused_by[e.keyword().empty() ? std::string(e.reason()).substr(0, 40) : e.keyword()];
      continue;
    } catch (const Error& e) {  // a grammar no finite text matches, say
      ++t.refused_by[std::string(e.what()).substr(0, 40)];
      continue;
    }
    ++t.compiled;
    for (const Json& v : entry["valid"]) {
      ++t.valid;
      t.valid_accepted += accepts(*g, v.dump());
    }
    for (const Json& v : entry["invalid"]) {
      ++t.invalid;
      if (!accepts(*g, v.dump())) ++t.invalid_rejected;
      else if (annotation_dependent().count(entry["name"].get<std::string>())) ++t.apart;
      else unsound.push_back(entry["name"].get<std::string>() + ": " + v.dump());
    }
  }
}

TEST(SchemaCorpus, InvalidInstancesAreRejected) {
  for (const char* file : {"suite-draft2020-12.jsonl", "suite-draft7.jsonl", "schemastore.jsonl"}) {
    Tally t;
    std::vector<std::string> unsound;
    run_corpus(file, t, unsound);
    EXPECT_TRUE(unsound.empty()) << file << ": invalid instances accepted:\n" << [&] {
      std::string s;
      for (const std::string& u : unsound) s += "  " + u + "\n";
      return s;
    }();
    std::string refused;
    for (const auto& [why, n] : t.refused_by) refused += " " + why + " " + std::to_string(n) + ";";
    std::printf("%s: %d of %d schemas compile; valid accepted %d of %d; invalid rejected %d of %d (%d apart: an "
                "annotation here); refused by:%s\n",
                file, t.compiled, t.schemas, t.valid_accepted, t.valid, t.invalid_rejected, t.invalid, t.apart, refused.c_str());
    EXPECT_GT(t.compiled, 0);
  }
}

// dsv4 bench schemas walks a corpus with the real vocabulary: its counts are the byte-level
// ones, and every mask is timed.
TEST(SchemaCorpus, BenchCommandWalksTheCorpusWithTheRealVocabulary) {
  test::TempDir dir;
  test::write_file(dir / "tiny.jsonl",
                   R"({"name": "a", "schema": {"type": "string", "maxLength": 3}, "valid": ["ab", "abc"], "invalid": ["abcd", 1]})"
                   "\n"
                   R"({"name": "b", "schema": {"uniqueItems": true}, "valid": [[1]], "invalid": [[1, 1]]})"
                   "\n");
  const auto r = test::run_dsv4("bench schemas --json --corpus " + dir.path(), "", 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json doc = Json::parse(r.out);
  const Json& tiny = doc["tiny.jsonl"];
  EXPECT_EQ(tiny["schemas"], 2);
  EXPECT_EQ(tiny["compiled"], 1);
  EXPECT_EQ(tiny["valid_accepted"], 2);
  EXPECT_EQ(tiny["invalid_rejected"], 2);
  EXPECT_GT(doc["mask_us"]["count"].get<int>(), 4);
  EXPECT_GT(doc["mask_us"]["max"].get<double>(), 0.0);
  EXPECT_EQ(doc["compile_ms"]["count"], 1);
  // A folder without corpus files is one clear error.
  const auto empty = test::run_dsv4("bench schemas --corpus " + (dir / "none"), "", 60);
  EXPECT_NE(empty.exit_code, 0);
}

}  // namespace
}  // namespace dsv4::constrain
