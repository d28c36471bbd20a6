// dsv4 synth and the safetensors writer: valid official-format checkpoints, deterministic
// bytes, finite activations through the engine, and the demo model's tokenizer files.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dsv4/io/checkpoint.h"
#include "dsv4/io/safetensors_writer.h"
#include "dsv4/model/engine.h"
#include "dsv4/synth/synth.h"
#include "dsv4/util/error.h"
#include "synth_util.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using Json = nlohmann::json;
using test::fixture;
using test::read_file;
using test::TempDir;

SynthOptions small(const std::string& out) { return test::small_synth(out, 3); }

std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& f : std::filesystem::directory_iterator(dir)) out[f.path().filename()] = read_file(f.path());
  return out;
}

TEST(SafetensorsWriter, RoundTrip) {
  TempDir tmp;
  const std::string path = tmp / "a.safetensors";
  {
    SafetensorsWriter w(path, {{"x", DType::kF32, {2, 3}}, {"y", DType::kBF16, {5}}, {"z", DType::kI64, {0}}},
                        {{"format", "pt"}});
    std::vector<float> x = {1, 2, 3, 4, 5, 6};
    w.write(x.data(), 24);
    uint8_t* y = w.reserve(10);
    for (int i = 0; i < 10; ++i) y[i] = static_cast<uint8_t>(i);
    w.finish();
  }
  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo* x = f.find("x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((8 + (x->offset - 8)) % 8, 0u);  // data starts 8-byte aligned
  std::vector<float> back(6);
  f.read(*x, back.data());
  EXPECT_EQ(back[5], 6.0f);
  std::vector<uint8_t> y(10);
  f.read(*f.find("y"), y.data());
  EXPECT_EQ(y[9], 9);

  // Too few bytes: finish() refuses and nothing is left behind.
  {
    SafetensorsWriter w(tmp / "b.safetensors", {{"x", DType::kF32, {4}}});
    w.write("abcd", 4);
    EXPECT_THROW(w.finish(), Error);
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "b.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(tmp / "b.safetensors.partial"));
  EXPECT_THROW(SafetensorsWriter(tmp / "c.safetensors", {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}}), Error);
}

// A small synthetic checkpoint passes the schema check, is byte-identical for the same
// seed, and runs through the engine with finite, sane logits.
TEST(Synth, ValidDeterministicAndRunnable) {
  TempDir tmp;
  synthesize(small(tmp / "a"));
  synthesize(small(tmp / "b"));
  SynthOptions other = small(tmp / "c");
  other.seed = 2;
  synthesize(other);
  const auto a = files_of(tmp / "a"), b = files_of(tmp / "b"), c = files_of(tmp / "c");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 8u);  // config, generation config, index, 5 shards (embed, 3 layers, head)
  EXPECT_NE(a.at("model-00002-of-00005.safetensors"), c.at("model-00002-of-00005.safetensors"));
  EXPECT_EQ(a.at("config.json"), c.at("config.json"));

  Checkpoint ck = Checkpoint::open(tmp / "a");  // schema, index and shards validated
  const ModelConfig& cfg = ck.config();
  EXPECT_EQ(cfg.num_layers, 3);
  EXPECT_EQ(cfg.layer(0).kind, AttentionKind::kSliding);
  EXPECT_EQ(cfg.layer(1).kind, AttentionKind::kCSA);
  EXPECT_EQ(cfg.layer(2).kind, AttentionKind::kHCA);
  EXPECT_EQ(cfg.num_hash_layers, 1);
  auto inspect = test::run_dsv4("inspect " + tmp / "a");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;

  EngineOptions eo;
  eo.threads = 1;
  eo.numerics = kernels::Numerics::kReference;
  auto engine = test::open_engine(tmp / "a", eo);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 37) % 300);
  std::vector<float> logits(tokens.size() * 300);
  SessionState s = engine->new_session();
  engine->forward(s, tokens, logits.data(), LogitRows::kAll);
  double sq = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    sq += double(v) * v;
  }
  const double rms = std::sqrt(sq / logits.size());
  EXPECT_GT(rms, 0.05);
  EXPECT_LT(rms, 50.0);
}

TEST(Synth, DefaultsAreTheRealFlashGeometry) {
  SynthOptions o;
  o.out = "unused";
  const Json c = Json::parse(synth_config_json(o));
  EXPECT_EQ(c["hidden_size"], 4096);
  EXPECT_EQ(c["num_attention_heads"], 64);
  EXPECT_EQ(c["head_dim"], 512);
  EXPECT_EQ(c["q_lora_rank"], 1024);
  EXPECT_EQ(c["o_groups"], 8);
  EXPECT_EQ(c["o_lora_rank"], 1024);
  EXPECT_EQ(c["n_routed_experts"], 256);
  EXPECT_EQ(c["moe_intermediate_size"], 2048);
  EXPECT_EQ(c["sliding_window"], 128);
  EXPECT_EQ(c["index_topk"], 512);
  EXPECT_EQ(c["vocab_size"], 129280);
  EXPECT_EQ(c["compress_ratios"], Json::parse("[0, 4, 128, 4]"));
  EXPECT_EQ(c["num_hash_layers"], 1);
  o.layers = 43;
  const Json full = Json::parse(synth_config_json(o));
  std::vector<int> real = {0, 0};
  for (int i = 0; i < 20; ++i) real.insert(real.end(), {4, 128});
  real.push_back(4);
  EXPECT_EQ(full["compress_ratios"].get<std::vector<int>>(), real);
  EXPECT_EQ(full["num_hash_layers"], 3);
  SynthOptions bad = o;
  bad.experts_per_token = 300;
  EXPECT_THROW(synth_config_json(bad), Error);
}

// The demo model: deterministic bytes, a tokenizer.json shaped exactly like the fixtures'
// (same pre-tokenizer, decoder, special tokens at the top ids), and it runs.
TEST(Synth, DemoModel) {
  TempDir tmp;
  auto r1 = test::run_dsv4("synth --demo --quiet --out " + tmp / "d1");
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto r2 = test::run_dsv4("synth --demo --quiet --out " + tmp / "d2");
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(files_of(tmp / "d1"), files_of(tmp / "d2"));

  const Json mine = Json::parse(read_file(tmp / "d1/tokenizer.json"));
  const Json ref = Json::parse(read_file(fixture("tiny-a") + "/tokenizer.json"));
  for (const char* key : {"version", "truncation", "padding", "normalizer", "pre_tokenizer", "post_processor", "decoder"})
    EXPECT_EQ(mine[key], ref[key]) << key;
  std::vector<std::string> keys_mine, keys_ref;
  for (auto& [k, v] : mine.items()) keys_mine.push_back(k);
  for (auto& [k, v] : ref.items()) keys_ref.push_back(k);
  EXPECT_EQ(keys_mine, keys_ref);
  const Json config = Json::parse(read_file(tmp / "d1/config.json"));
  const int vocab = config["vocab_size"];
  EXPECT_EQ(vocab, 1024);
  ASSERT_EQ(mine["added_tokens"].size(), 16u);
  for (size_t i = 0; i < 16; ++i) {
    Json want = ref["added_tokens"][i];
    want["id"] = vocab - 16 + static_cast<int>(i);
    EXPECT_EQ(mine["added_tokens"][i], want);
  }
  EXPECT_EQ(config["bos_token_id"], vocab - 16);
  EXPECT_EQ(config["eos_token_id"], vocab - 15);
  for (auto& [k, v] : ref["model"].items()) {
    if (k != "vocab" && k != "merges") {
      EXPECT_EQ(mine["model"][k], v) << k;
    }
  }
  const Json& v = mine["model"]["vocab"];
  const Json& merges = mine["model"]["merges"];
  EXPECT_EQ(v.size() + 16, size_t(vocab));
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string m = merges[i];
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos);
    ASSERT_TRUE(v.contains(m.substr(0, sp))) << m;
    ASSERT_TRUE(v.contains(m.substr(sp + 1))) << m;
    EXPECT_EQ(v[m.substr(0, sp) + m.substr(sp + 1)], 256 + static_cast<int>(i)) << m;
  }
  EXPECT_EQ(v["Ġ"], 32);  // GPT-2 byte-to-unicode: the space byte
  EXPECT_EQ(v["Ā"], 0);
  const Json tc = Json::parse(read_file(tmp / "d1/tokenizer_config.json"));
  EXPECT_EQ(tc, Json::parse(read_file(fixture("tiny-a") + "/tokenizer_config.json")));
  const Json gen = Json::parse(read_file(tmp / "d1/generation_config.json"));
  EXPECT_EQ(gen["bos_token_id"], vocab - 16);
  EXPECT_EQ(gen["eos_token_id"], vocab - 15);

  auto run = test::run_dsv4("generate -m " + tmp / "d1" + " --tokens 1008,84,104,101 -n 4 --greedy --print-ids");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(std::count(run.out.begin(), run.out.end(), ','), 3) << run.out;
}

// dsv4 bench -m prints the JSON fields the review scripts read.
TEST(Bench, ModelJsonFields) {
  auto r = test::run_dsv4("bench -m " + fixture("tiny-a") +
                          " --ram min --prompt-tokens 6 --gen-tokens 3 --threads 1 --ssd-probe-bytes 4194304 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  for (const char* key : {"load_s", "ttft_s", "prefill_tok_s", "prefill_gflops", "fma_gflops", "prefill_vs_fma",
                          "decode_tok_s", "hit_rate", "bytes_read_per_token", "ssd_gbps_measured",
                          "io_bound_s_per_token", "decode_s_per_token", "peak_rss_bytes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j[key].is_number()) << key;
    EXPECT_GE(j[key].get<double>(), 0.0) << key;
  }
  ASSERT_TRUE(j.contains("resident_s_per_token"));
  EXPECT_TRUE(j["resident_s_per_token"].is_null());  // the minimum budget streams
  EXPECT_LE(j["hit_rate"].get<double>(), 1.0);
  EXPECT_GT(j["ssd_gbps_measured"].get<double>(), 0.0);
  EXPECT_GT(j["bytes_read_per_token"].get<double>(), 0.0);
  // The layout found and the ranges (and requests) an expert took: the fixture's order is
  // neither official nor contiguous; its experts are one range each but for one split one.
  EXPECT_EQ(j["details"]["tensor_order"], "other");
  EXPECT_GE(j["details"]["prefill_ranges_per_expert"].get<double>(), 1.0);
  // Each window is a request of its own or part of a neighbour's (merged; the fixture's
  // experts are small windows next to each other, so some are).
  EXPECT_GT(j["details"]["prefill_merged_windows_per_expert"].get<double>(), 0.0);
  EXPECT_GE(j["details"]["prefill_requests_per_expert"].get<double>() +
                j["details"]["prefill_merged_windows_per_expert"].get<double>(),
            j["details"]["prefill_ranges_per_expert"].get<double>() - 1e-9);
  // Effective prefill FLOP/s: 2 x (parameters multiplied per token x tokens + head) / TTFT,
  // against the FMA peak measured in the same run.
  EXPECT_GT(j["fma_gflops"].get<double>(), 0.0);
  const double per_token = j["details"]["prefill_params_per_token"].get<double>();
  const double head = j["details"]["head_params"].get<double>();
  EXPECT_GT(per_token, 0.0);
  EXPECT_GT(head, 0.0);
  EXPECT_NEAR(j["prefill_gflops"].get<double>(), 2.0 * (per_token * 6 + head) / j["ttft_s"].get<double>() / 1e9,
              1e-6 * j["prefill_gflops"].get<double>());
  EXPECT_NEAR(j["prefill_vs_fma"].get<double>(), j["prefill_gflops"].get<double>() / j["fma_gflops"].get<double>(),
              1e-9);

  auto all = test::run_dsv4("bench -m " + fixture("tiny-a") +
                            " --ram 4G --prompt-tokens 6 --gen-tokens 3 --threads 1 --ssd-probe-bytes 4194304 --json");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const Json k = Json::parse(all.out);
  EXPECT_TRUE(k["resident_s_per_token"].is_number());
  EXPECT_EQ(k["hit_rate"], 1.0);
  // Same prompt, same tokens whatever the budget.
  EXPECT_EQ(k["details"]["generated"], j["details"]["generated"]);

  auto bad = test::run_dsv4("bench -m " + fixture("tiny-a") + " --ram 1K --json");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--ram"), std::string::npos) << bad.err;
}

// --prompt-file: the prompt is those ids (real text, for a trained model's routing), and with
// --chunk 1 the trace has every prompt token's acquires, one token after another.
TEST(Bench, PromptFileAndPerTokenTrace) {
  TempDir tmp;
  test::write_file(tmp / "ids.txt", "496, 499 84 101\n288,301,101");
  auto r = test::run_dsv4("bench -m " + fixture("tiny-a") + " --ram min --prompt-file " + tmp / "ids.txt" +
                          " --chunk 1 --gen-tokens 2 --threads 1 --ssd-probe-bytes 4194304 --json --trace-out " +
                          tmp / "trace.txt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["details"]["prompt_tokens"], 7);
  const std::string trace = read_file(tmp / "trace.txt");
  size_t acquires = 0;
  std::istringstream lines(trace);
  for (std::string line; std::getline(lines, line);) acquires += line.rfind("A ", 0) == 0;
  EXPECT_EQ(acquires, size_t(7 + 2) * 6 * 3);  // (prompt + decoded) tokens x 6 layers x top-3
  test::write_file(tmp / "bad.txt", "1, 2, 99999");
  auto bad = test::run_dsv4("bench -m " + fixture("tiny-a") + " --ram min --prompt-file " + tmp / "bad.txt");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("bad.txt: token id 99999 is outside the vocabulary"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace dsv4
