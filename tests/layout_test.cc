// The two byte layouts (io/tensor_order.h): the safetensors library's order, synth and
// relayout writing either with every tensor's bytes unchanged, inspect describing what it
// finds, the expert reads planned for each, and the fixtures' logits bit-identical in both
// layouts, resident and at --ram min, with every numerics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "dsv4/experts/expert_layout.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/io/relayout.h"
#include "dsv4/io/safetensors.h"
#include "dsv4/io/tensor_order.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/synth/synth.h"
#include "dsv4/util/error.h"
#include "synth_util.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using Json = nlohmann::json;
using kernels::Numerics;
using test::fixture;
using test::TempDir;

std::vector<std::string> names_of(const std::vector<TensorDecl>& decls) {
  std::vector<std::string> out;
  for (const TensorDecl& d : decls) out.push_back(d.name);
  return out;
}

TEST(TensorOrder, TheSafetensorsLibrarysOrder) {
  // Dtype descending in the library's enum order, then name bytewise ("10" < "2", "Z" < "a").
  std::vector<TensorDecl> decls = {
      {"x.w2.weight", DType::kI8, {1}},     {"x.w1.weight", DType::kI8, {1}},   {"x.attn.weight", DType::kF8_E4M3, {1}},
      {"x.e.2.scale", DType::kF8_E8M0, {1}}, {"x.e.10.scale", DType::kF8_E8M0, {1}}, {"norm", DType::kBF16, {1}},
      {"a_fn", DType::kF32, {1}},           {"Z_fn", DType::kF32, {1}},         {"tid2eid", DType::kI64, {1}},
      {"flag", DType::kBool, {1}},          {"u", DType::kU8, {1}},
  };
  sort_safetensors_order(decls);
  EXPECT_EQ(names_of(decls), (std::vector<std::string>{"tid2eid", "Z_fn", "a_fn", "norm", "x.e.10.scale", "x.e.2.scale",
                                                       "x.attn.weight", "x.w1.weight", "x.w2.weight", "u", "flag"}));
}

TEST(TensorOrder, TheOfficialIndexsSharding) {
  EXPECT_EQ(official_shard_of("embed.weight", 43), 0);
  EXPECT_EQ(official_shard_of("layers.0.ffn.experts.0.w1.weight", 43), 1);  // model-00002-of-00046
  EXPECT_EQ(official_shard_of("layers.42.attn.wq_a.weight", 43), 43);
  for (const char* tail : {"head.weight", "norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale"})
    EXPECT_EQ(official_shard_of(tail, 43), 44) << tail;
  EXPECT_EQ(official_shard_of("mtp.0.e_proj.weight", 43), 45);  // model-00046-of-00046
  EXPECT_EQ(parse_tensor_layout("contiguous"), TensorLayout::kContiguous);
  EXPECT_THROW(parse_tensor_layout("sorted"), Error);
}

// Every tensor of `dir` (through its index): dtype, shape and bytes.
std::map<std::string, std::string> tensor_bytes(const std::string& dir) {
  Checkpoint ck = Checkpoint::open(dir);
  std::map<std::string, std::string> out;
  for (const auto& s : ck.shards()) {
    for (const TensorInfo& t : s->tensors()) {
      std::string bytes(t.bytes, '\0');
      s->read(t, bytes.data());
      out[t.name] = std::string(dtype_name(t.dtype)) + t.shape_string() + bytes;
    }
  }
  return out;
}

std::set<std::string> orders_of(const std::string& dir) {
  Checkpoint ck = Checkpoint::open(dir);
  std::set<std::string> orders;
  for (const auto& s : ck.shards()) orders.insert(shard_tensor_order(*s, ck.config()));
  return orders;
}

// The fixtures re-laid once per test binary: name -> {official copy, contiguous copy}.
struct Relaid {
  std::string official, contiguous;
};
const Relaid& relaid(const std::string& name) {
  static TempDir dir;
  static std::map<std::string, Relaid> done;
  auto it = done.find(name);
  if (it != done.end()) return it->second;
  Relaid r{dir / (name + "-official"), dir / (name + "-contiguous")};
  relayout_checkpoint(fixture(name), r.official, TensorLayout::kOfficial);
  relayout_checkpoint(r.official, r.contiguous, TensorLayout::kContiguous);
  return done[name] = r;
}

// Both copies hold the fixture's tensors with the fixture's bytes in the fixture's shards, the
// same index and other files, in the order asked for; inspect says which.
TEST(Relayout, SameTensorsSameShardsOtherOrder) {
  for (const char* name : {"tiny-a", "flashlike"}) {
    const Relaid& r = relaid(name);
    const auto want = tensor_bytes(fixture(name));
    EXPECT_EQ(tensor_bytes(r.official), want) << name;
    EXPECT_EQ(tensor_bytes(r.contiguous), want) << name;
    for (const char* file : {"model.safetensors.index.json", "config.json", "reference.json"}) {
      EXPECT_EQ(test::read_file(r.official + "/" + file), test::read_file(fixture(name) + "/" + file)) << file;
      EXPECT_EQ(test::read_file(r.contiguous + "/" + file), test::read_file(fixture(name) + "/" + file)) << file;
    }
    EXPECT_EQ(orders_of(r.official), std::set<std::string>{"official"}) << name;
    EXPECT_EQ(orders_of(r.contiguous), std::set<std::string>{"contiguous"}) << name;
    const std::string header = read_raw_header(File::open_read(r.official + "/model-00001-of-00003.safetensors"));
    EXPECT_NE(header.find(R"("__metadata__":{"format":"pt"})"), std::string::npos) << name;

    // The fixtures split one expert over two shards: relayout keeps the sharding.
    auto inspect = test::run_dsv4("inspect --json " + r.official);
    ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
    const Json layout = Json::parse(inspect.out)["layout"];
    EXPECT_EQ(layout["tensor_order"], "official");
    EXPECT_EQ(layout["straddling_experts"], 1);
    const Json contiguous = Json::parse(test::run_dsv4("inspect --json " + r.contiguous).out)["layout"];
    EXPECT_EQ(contiguous["tensor_order"], "contiguous");
    EXPECT_EQ(layout["experts_by_ranges"]["2"], contiguous["experts_by_ranges"]["1"]);  // all but the split one
    auto text = test::run_dsv4("inspect " + r.official);
    EXPECT_NE(text.out.find("layout      official"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("1 expert straddles two shards"), std::string::npos) << text.out;
  }
}

TEST(Relayout, ClearErrors) {
  TempDir tmp;
  EXPECT_THROW(relayout_checkpoint(fixture("tiny-a"), fixture("tiny-a"), TensorLayout::kOfficial), Error);
  test::copy_dir(fixture("tiny-a"), tmp / "cut");
  std::filesystem::resize_file(tmp / "cut/model-00002-of-00003.safetensors", 4096);
  auto r = test::run_dsv4("relayout --quiet " + tmp / "cut" + " " + tmp / "out");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("model-00002-of-00003.safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  auto bad = test::run_dsv4("relayout --layout sorted " + fixture("tiny-a") + " " + tmp / "x");
  EXPECT_NE(bad.err.find("--layout"), std::string::npos) << bad.err;
}

// In the official layout an expert is read as two windows (its weights, then its scales),
// in the contiguous one as one; the slot holds both, so the cache keeps an expert's scales.
TEST(Relayout, ExpertReadPlans) {
  const Relaid& r = relaid("flashlike");
  Checkpoint official = Checkpoint::open(r.official), contiguous = Checkpoint::open(r.contiguous);
  ExpertLayout a(official), b(contiguous);
  const ExpertReadPlan& p = a.plan(0, 0);
  ASSERT_EQ(p.windows.size(), 2u);
  EXPECT_EQ(p.windows[0].shard, p.windows[1].shard);
  EXPECT_EQ(b.plan(0, 0).windows.size(), 1u);
  EXPECT_EQ(p.payload_bytes, b.plan(0, 0).payload_bytes);
  EXPECT_LE(p.read_bytes, b.plan(0, 0).read_bytes + kDirectAlign);  // no more than one page of slack more
  EXPECT_GE(p.slot_bytes, p.read_bytes);
  const ExpertRangeCensus census = census_expert_ranges(official);
  EXPECT_EQ(census.experts, int64_t(official.config().num_layers) * official.config().n_routed_experts);
  EXPECT_EQ(census.straddling, 1);
}

// In the official layout a layer's scales are one run in the file, sorted by name: each
// expert's scales are followed by those of the next expert in name order ("0", "1", "10",
// "11", ...), which is what lets the store read neighbours' scales as one request.
TEST(Relayout, NeighboursInTheFile) {
  const Relaid& r = relaid("flashlike");
  Checkpoint official = Checkpoint::open(r.official);
  ExpertLayout a(official);
  const int n = official.config().n_routed_experts;
  for (int l = 0; l < official.config().num_layers; ++l) {
    // Experts by name, each with the shard its scales are in.
    std::vector<std::pair<int, std::string>> names;
    for (int e = 0; e < n; ++e) {
      ASSERT_GE(a.small_window(l, e), 1) << "the scales: after the weights";
      names.push_back({a.plan(l, e).windows[static_cast<size_t>(a.small_window(l, e))].shard, std::to_string(e)});
    }
    std::sort(names.begin(), names.end());
    int links = 0;
    for (int e = 0; e < n; ++e) {
      const int f = a.next_in_file(l, e);
      if (f < 0) continue;
      ++links;
      EXPECT_EQ(a.previous_in_file(l, f), e);
      const int shard = a.plan(l, e).windows[static_cast<size_t>(a.small_window(l, e))].shard;
      const auto pos = std::find(names.begin(), names.end(), std::make_pair(shard, std::to_string(e)));
      ASSERT_NE(pos + 1, names.end());
      EXPECT_EQ((pos + 1)->second, std::to_string(f)) << "layer " << l;
      const ReadWindow &x = a.plan(l, e).windows[static_cast<size_t>(a.small_window(l, e))],
                       &y = a.plan(l, f).windows[static_cast<size_t>(a.small_window(l, f))];
      EXPECT_LE(y.file_offset, x.file_offset + x.length);
      EXPECT_GE(y.file_offset + kDirectAlign, x.file_offset + x.length);
    }
    // One run per layer, broken only where an expert lies in another shard (the fixture splits one).
    EXPECT_GE(links, n - 3) << "layer " << l;
  }
}

// synth writes the official layout by default (one shard per layer, no expert split) and the
// contiguous one on request, with the same tensor bytes.
TEST(Synth, OfficialLayoutByDefault) {
  TempDir tmp;
  SynthOptions o = test::small_synth(tmp / "official", 2);
  o.mtp_layers = 1;
  synthesize(o);
  SynthOptions c = o;
  c.out = tmp / "contiguous";
  c.layout = TensorLayout::kContiguous;
  c.shard_bytes = 1 << 20;
  synthesize(c);
  EXPECT_EQ(tensor_bytes(o.out), tensor_bytes(c.out));
  EXPECT_EQ(orders_of(o.out), std::set<std::string>{"official"});
  EXPECT_EQ(orders_of(c.out), std::set<std::string>{"contiguous"});
  Checkpoint ck = Checkpoint::open(o.out);
  EXPECT_EQ(ck.shards().size(), 5u);  // embed, 2 layers, head, mtp.0
  EXPECT_NE(ck.get("layers.0.ffn.experts.0.w1.weight").shard->path().find("model-00002-of-00005"), std::string::npos);
  EXPECT_NE(ck.get("mtp.0.ffn.experts.0.w1.weight").shard->path().find("model-00005-of-00005"), std::string::npos);
  const ExpertRangeCensus census = census_expert_ranges(ck);
  EXPECT_EQ(census.experts_by_ranges, (std::map<int, int64_t>{{2, 16}}));
  EXPECT_EQ(census.straddling, 0);
}

// ---------------------------------------------------------------------------------------
// The fixtures' logits in both layouts, bit for bit the fixture's own (whose order is
// neither), resident and streamed at --ram min, with each numerics.

struct Case {
  std::string fixture;
  Numerics numerics;
  bool streamed;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << (c.streamed ? " min" : " resident"); }

std::vector<float> run(const std::string& dir, const Case& c, ExpertStats* stats = nullptr) {
  const Json ref = Json::parse(test::read_file(dir + "/reference.json"));
  LoadOptions o;
  o.engine.numerics = c.numerics;
  o.engine.threads = 1;
  o.ram = c.streamed ? "min" : "64G";
  LoadedEngine loaded = load_engine(dir, o);
  EXPECT_EQ(loaded.plan.all_resident, !c.streamed);
  Engine& e = *loaded.engine;
  const int64_t V = e.config().vocab_size;
  std::vector<int32_t> tokens = ref["sequences"][1]["tokens"].get<std::vector<int32_t>>();
  tokens.resize(std::min<size_t>(tokens.size(), 64));
  std::vector<float> out(tokens.size() * V);
  SessionState s = e.new_session();
  e.forward(s, tokens, out.data(), LogitRows::kAll, 16);
  // A few greedy steps: decode (one row at a time) reads experts the prompt did not.
  std::vector<int32_t> prompt = ref["greedy"][0]["prompt"].get<std::vector<int32_t>>();
  SessionState g = e.new_session();
  std::vector<float> logits(V);
  e.forward(g, prompt, logits.data(), LogitRows::kLast);
  for (int i = 0; i < 6; ++i) {
    out.insert(out.end(), logits.begin(), logits.end());
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    e.forward(g, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
  }
  if (stats) *stats = e.experts().stats();
  return out;
}

class LayoutBitExact : public ::testing::TestWithParam<Case> {};

TEST_P(LayoutBitExact, SameLogitsInBothLayouts) {
  const Case& c = GetParam();
  const std::vector<float> want = run(fixture(c.fixture), c);
  const Relaid& r = relaid(c.fixture);
  for (const std::string& dir : {r.official, r.contiguous}) {
    ExpertStats stats;
    const std::vector<float> got = run(dir, c, &stats);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << dir;
    if (c.streamed && dir == r.official) {
      // Neighbours' scales were read as one request, so an expert took fewer than two.
      EXPECT_GT(stats.merged_windows, 0u);
      EXPECT_LT(stats.requests_per_read(), 2.0);
      EXPECT_GT(stats.reads, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LayoutBitExact,
                         ::testing::Values(Case{"tiny-a", Numerics::kReference, false},
                                           Case{"tiny-a", Numerics::kReference, true},
                                           Case{"tiny-a", Numerics::kFast, false},
                                           Case{"tiny-a", Numerics::kFast, true},
                                           Case{"flashlike", Numerics::kReference, false},
                                           Case{"flashlike", Numerics::kReference, true},
                                           Case{"flashlike", Numerics::kFast, false},
                                           Case{"flashlike", Numerics::kFast, true}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           std::string name = c.fixture + (c.numerics == Numerics::kFast ? "_fast" : "_reference") +
                                              (c.streamed ? "_ram_min" : "_resident");
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace dsv4
