// The checkpoint reader on the fixtures and on crafted bad checkpoints: every bad one must
// be refused with exit code 1 and one error line naming the file and the tensor or field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "dsv4/io/checkpoint.h"
#include "dsv4/io/schema.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::fixture;
using test::read_file;
using test::TempDir;
using test::write_file;
using Json = nlohmann::ordered_json;

TEST(Checkpoint, TinyAScheduleMatchesReadme) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  const ModelConfig& c = ck.config();
  ASSERT_EQ(c.layers.size(), 7u);
  const AttentionKind want[] = {AttentionKind::kSliding, AttentionKind::kCSA, AttentionKind::kHCA,
                                AttentionKind::kCSA,     AttentionKind::kHCA, AttentionKind::kSliding,
                                AttentionKind::kSliding};
  const int ratios[] = {0, 4, 8, 4, 8, 0, 0};
  const bool hash[] = {true, true, false, false, false, false, false};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(c.layers[i].kind, want[i]) << i;
    EXPECT_EQ(c.layers[i].compress_ratio, ratios[i]) << i;
    EXPECT_EQ(c.layers[i].hash_routed, hash[i]) << i;
  }
  EXPECT_TRUE(c.layers[6].is_mtp);
  EXPECT_EQ(ck.shards().size(), 3u);
  EXPECT_EQ(ck.tensors().size(), 585u);  // 143 + 355 + 87 per the README
  EXPECT_EQ(c.bos_token_id, 496);
  EXPECT_EQ(c.eos_token_id, 497);
}

TEST(Checkpoint, FlashlikeLoads) {
  Checkpoint ck = Checkpoint::open(fixture("flashlike"));
  const ModelConfig& c = ck.config();
  ASSERT_EQ(c.layers.size(), 8u);
  EXPECT_EQ(c.layers[3].kind, AttentionKind::kHCA);
  EXPECT_EQ(c.layers[3].compress_ratio, 128);
  EXPECT_EQ(c.layers[2].kind, AttentionKind::kCSA);
  EXPECT_TRUE(c.layers[2].hash_routed);
  EXPECT_FALSE(c.layers[3].hash_routed);
  EXPECT_EQ(ck.tensors().size(), 469u + 453u + 135u);
}

TEST(Checkpoint, InspectPrintsSchedule) {
  auto r = test::run_dsv4("inspect " + fixture("tiny-a"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  layer 1    CSA ratio 4    hash (tid2eid)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  layer 2    HCA ratio 8    top-k + bias"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mtp.0"), std::string::npos);
  auto j = test::run_dsv4("inspect --json " + fixture("tiny-a"));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["layers"][4]["attention"], "HCA");
  EXPECT_EQ(doc["tensor_count"], 585);
  EXPECT_EQ(doc["mtp"], true);
  // w1, w3: 64 x 256 FP4 (8192 B) + scales 64 x 8; w2: 256 x 64 (8192 B) + 256 x 2.
  EXPECT_EQ(doc["bytes_per_expert"], 3 * 8192 + 2 * 512 + 512);
}

// ---- crafted bad checkpoints --------------------------------------------------------------

struct Shard {
  Json header;
  std::string data;
};

Shard read_shard(const std::string& path) {
  std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return {Json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

void write_shard(const std::string& path, const std::string& header_text, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_file(path, out + header_text + data);
}

void write_shard(const std::string& path, const Shard& s) { write_shard(path, s.header.dump(), s.data); }

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_ / "ck";
    test::copy_dir(fixture("tiny-a"), dir_);
  }
  std::string shard(int i) const { return dir_ + "/model-0000" + std::to_string(i) + "-of-00003.safetensors"; }
  void edit_shard(int i, const std::function<void(Shard&)>& f) {
    Shard s = read_shard(shard(i));
    f(s);
    write_shard(shard(i), s);
  }
  void edit_config(const std::function<void(Json&)>& f) {
    Json j = Json::parse(read_file(dir_ + "/config.json"));
    f(j);
    write_file(dir_ + "/config.json", j.dump(2));
  }
  void edit_index(const std::function<void(Json&)>& f) {
    Json j = Json::parse(read_file(dir_ + "/model.safetensors.index.json"));
    f(j);
    write_file(dir_ + "/model.safetensors.index.json", j.dump(2));
  }
  // Runs inspect; expects exit 1, a single error line, and every `needle` in it.
  void expect_refused(std::initializer_list<std::string> needles, bool one_line = true) {
    auto r = test::run_dsv4("inspect " + dir_, "", 60);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    ASSERT_FALSE(r.err.empty());
    if (one_line) {
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
    for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
  }

  TempDir tmp_;
  std::string dir_;
};

TEST_F(BadCheckpoint, TruncatedShard) {
  std::string bytes = read_file(shard(2));
  write_file(shard(2), bytes.substr(0, bytes.size() / 2));
  expect_refused({"model-00002-of-00003.safetensors", "tensor ", "past the end of the file"});
}

TEST_F(BadCheckpoint, HeaderLengthPastEof) {
  std::string bytes = read_file(shard(3));
  uint64_t n = bytes.size() + 100;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_file(shard(3), bytes);
  expect_refused({"model-00003-of-00003.safetensors", "header length", "past the end"});
}

TEST_F(BadCheckpoint, HugeHeader) {
  std::string bytes = read_file(shard(3));
  uint64_t n = 1ull << 40;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_file(shard(3), bytes);
  expect_refused({"model-00003-of-00003.safetensors", "exceeds"});
}

TEST_F(BadCheckpoint, InvalidHeaderJson) {
  Shard s = read_shard(shard(1));
  std::string text = s.header.dump();
  text.resize(text.size() / 2);  // cut in the middle of the object
  write_shard(shard(1), text, s.data);
  expect_refused({"model-00001-of-00003.safetensors", "not valid JSON"});
}

TEST_F(BadCheckpoint, OverlappingOffsets) {
  edit_shard(3, [](Shard& s) {
    // Point the second tensor (by offset) at the first one's bytes; same size so only the overlap is wrong.
    std::string a, b;
    for (auto& [name, v] : s.header.items()) {
      if (name == "__metadata__") continue;
      if (v["data_offsets"][0] == 0) a = name;
    }
    for (auto& [name, v] : s.header.items()) {
      if (name == "__metadata__" || name == a) continue;
      uint64_t size = v["data_offsets"][1].get<uint64_t>() - v["data_offsets"][0].get<uint64_t>();
      uint64_t asize = s.header[a]["data_offsets"][1].get<uint64_t>();
      if (size <= asize + 8) {
        b = name;
        v["data_offsets"] = {4, 4 + size};
        break;
      }
    }
    ASSERT_FALSE(b.empty());
  });
  expect_refused({"model-00003-of-00003.safetensors", "overlap"});
}

TEST_F(BadCheckpoint, OffsetsOutsideFile) {
  edit_shard(3, [](Shard& s) {
    auto& v = s.header["mtp.0.attn.attn_sink"];
    uint64_t size = v["data_offsets"][1].get<uint64_t>() - v["data_offsets"][0].get<uint64_t>();
    v["data_offsets"] = {s.data.size() + 64, s.data.size() + 64 + size};
  });
  expect_refused({"model-00003-of-00003.safetensors", "mtp.0.attn.attn_sink", "past the end"});
}

TEST_F(BadCheckpoint, ByteCountMismatch) {
  edit_shard(2, [](Shard& s) { s.header["norm.weight"]["dtype"] = "F32"; });
  expect_refused({"model-00002-of-00003.safetensors", "norm.weight", "bytes"});
}

TEST_F(BadCheckpoint, DtypeMismatch) {
  edit_shard(2, [](Shard& s) { s.header["norm.weight"]["dtype"] = "F16"; });
  expect_refused({"model-00002-of-00003.safetensors", "norm.weight", "dtype F16, expected BF16"});
}

TEST_F(BadCheckpoint, UnknownDtype) {
  edit_shard(2, [](Shard& s) { s.header["norm.weight"]["dtype"] = "Q4_K"; });
  expect_refused({"model-00002-of-00003.safetensors", "norm.weight", "unknown dtype"});
}

TEST_F(BadCheckpoint, ShapeMismatch) {
  edit_shard(2, [](Shard& s) { s.header["head.weight"]["shape"] = {256, 512}; });
  expect_refused({"model-00002-of-00003.safetensors", "head.weight", "shape [256, 512], expected [512, 256]"});
}

TEST_F(BadCheckpoint, WrongScaleShape) {
  edit_shard(1, [](Shard& s) {
    auto& v = s.header["layers.0.attn.wq_b.scale"];
    auto shape = v["shape"];
    v["shape"] = {shape[1], shape[0]};
  });
  expect_refused({"model-00001-of-00003.safetensors", "layers.0.attn.wq_b.scale", "expected"});
}

TEST_F(BadCheckpoint, MissingTensor) {
  edit_shard(2, [](Shard& s) { s.header.erase("hc_head_scale"); });
  edit_index([](Json& j) { j["weight_map"].erase("hc_head_scale"); });
  expect_refused({"hc_head_scale", "missing"});
}

TEST_F(BadCheckpoint, IndexedTensorMissingFromShard) {
  edit_shard(2, [](Shard& s) { s.header.erase("hc_head_scale"); });
  expect_refused({"model-00002-of-00003.safetensors", "hc_head_scale", "missing from this shard"}, false);
}

TEST_F(BadCheckpoint, DuplicateTensorAcrossShards) {
  // Append a second copy of norm.weight (BF16 [256]) to shard 3.
  Shard s2 = read_shard(shard(2));
  const auto& src = s2.header["norm.weight"];
  uint64_t b = src["data_offsets"][0], e = src["data_offsets"][1];
  edit_shard(3, [&](Shard& s) {
    uint64_t at = s.data.size();
    s.data += s2.data.substr(b, e - b);
    s.header["norm.weight"] = {{"dtype", "BF16"}, {"shape", {256}}, {"data_offsets", {at, at + (e - b)}}};
  });
  expect_refused({"norm.weight", "duplicated"}, false);
}

// A checkpoint with drafter tensors the engine does not use (a later MTP layer, DSpark-style
// heads under mtp.0) loads its target model; inspect lists them as unused; output unchanged.
TEST_F(BadCheckpoint, ExtraDrafterTensorsAreListedUnusedAndTheModelRuns) {
  Shard s2 = read_shard(shard(2));
  const auto& src = s2.header["norm.weight"];
  uint64_t b = src["data_offsets"][0], e = src["data_offsets"][1];
  const std::vector<std::string> extra = {"mtp.1.e_proj.weight", "mtp.1.hnorm.weight", "mtp.0.markov_w1"};
  edit_shard(3, [&](Shard& s) {
    for (const std::string& name : extra) {
      uint64_t at = s.data.size();
      s.data += s2.data.substr(b, e - b);
      s.header[name] = {{"dtype", "BF16"}, {"shape", {256}}, {"data_offsets", {at, at + (e - b)}}};
    }
  });
  edit_index([&](Json& j) {
    for (const std::string& name : extra) j["weight_map"][name] = "model-00003-of-00003.safetensors";
  });
  auto r = test::run_dsv4("inspect " + dir_, "", 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mtp         yes, mtp.0 drafts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unused      3 tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mtp.0.markov_w1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mtp.1.*"), std::string::npos) << r.out;
  const std::string gen = " --numerics reference --tokens 5,6,7,8 -n 6";
  auto want = test::run_dsv4("generate -m " + fixture("tiny-a") + gen, "", 60);
  auto got = test::run_dsv4("generate -m " + dir_ + gen, "", 60);
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(got.out, want.out);
  // The drafter itself still runs: MTP drafts, same tokens.
  auto drafted = test::run_dsv4("run -m " + dir_ + " --raw --temperature 0 --max-tokens 6 --spec mtp hello", "", 60);
  auto plain = test::run_dsv4("run -m " + dir_ + " --raw --temperature 0 --max-tokens 6 --spec off hello", "", 60);
  ASSERT_EQ(drafted.exit_code, 0) << drafted.err;
  EXPECT_EQ(drafted.out, plain.out);
}

// A broken mtp.0 costs the drafter, not the model: inspect says why, --spec mtp refuses with
// one line, auto and off run as before.
TEST_F(BadCheckpoint, ABrokenMtpLayerLeavesTheTargetModel) {
  edit_shard(3, [](Shard& s) { s.header.erase("mtp.0.enorm.weight"); });
  edit_index([](Json& j) { j["weight_map"].erase("mtp.0.enorm.weight"); });
  auto r = test::run_dsv4("inspect " + dir_, "", 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mtp         unusable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mtp.0.enorm.weight is missing"), std::string::npos) << r.out;
  const std::string gen = " --numerics reference --tokens 5,6,7,8 -n 6";
  EXPECT_EQ(test::run_dsv4("generate -m " + dir_ + gen, "", 60).out,
            test::run_dsv4("generate -m " + fixture("tiny-a") + gen, "", 60).out);
  auto mtp = test::run_dsv4("run -m " + dir_ + " --raw --temperature 0 --max-tokens 4 --spec mtp hello", "", 60);
  EXPECT_NE(mtp.exit_code, 0);
  EXPECT_NE(mtp.err.find("spec \"mtp\""), std::string::npos) << mtp.err;
  EXPECT_EQ(test::run_dsv4("run -m " + dir_ + " --raw --temperature 0 --max-tokens 4 --spec auto hello", "", 60).exit_code, 0);
}

TEST_F(BadCheckpoint, DuplicateKeyInHeader) {
  Shard s = read_shard(shard(3));
  std::string text = s.header.dump();
  // Repeat the first tensor entry verbatim.
  size_t first = text.find("\"mtp.");
  size_t end = text.find("]}", first) + 2;
  text.insert(first, text.substr(first, end - first) + ",");
  write_shard(shard(3), text, s.data);
  expect_refused({"model-00003-of-00003.safetensors", "appears twice"});
}

TEST_F(BadCheckpoint, IndexNamesMissingShard) {
  edit_index([](Json& j) { j["weight_map"]["norm.weight"] = "model-00009-of-00009.safetensors"; });
  expect_refused({"model-00009-of-00009.safetensors", "does not exist"});
}

TEST_F(BadCheckpoint, IndexPathTraversal) {
  edit_index([](Json& j) { j["weight_map"]["norm.weight"] = "../../etc/passwd"; });
  expect_refused({"model.safetensors.index.json", "norm.weight", "not a file name"});
}

TEST_F(BadCheckpoint, ConfigNegativeValue) {
  edit_config([](Json& j) { j["hidden_size"] = -256; });
  expect_refused({"config.json", "hidden_size"});
}

TEST_F(BadCheckpoint, ConfigFloatWhereIntegerExpected) {
  edit_config([](Json& j) { j["num_hidden_layers"] = 6.0; });
  expect_refused({"config.json", "num_hidden_layers", "integer"});
}

TEST_F(BadCheckpoint, ConfigAbsurdValue) {
  edit_config([](Json& j) { j["num_hidden_layers"] = 1000000000; });
  expect_refused({"config.json", "num_hidden_layers", "outside"});
}

TEST_F(BadCheckpoint, ConfigNaN) {
  std::string text = read_file(dir_ + "/config.json");
  size_t at = text.find("\"rms_norm_eps\": 1e-06");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, std::string("\"rms_norm_eps\": 1e-06").size(), "\"rms_norm_eps\": NaN");
  write_file(dir_ + "/config.json", text);
  expect_refused({"config.json", "not valid JSON"});
}

TEST_F(BadCheckpoint, ConfigAbsurdFloat) {
  edit_config([](Json& j) { j["rms_norm_eps"] = 1e300; });
  expect_refused({"config.json", "rms_norm_eps", "outside"});
}

TEST_F(BadCheckpoint, ConfigCompressRatiosWrongLength) {
  edit_config([](Json& j) { j["compress_ratios"] = {0, 4, 8}; });
  expect_refused({"config.json", "compress_ratios", "3 entries"});
}

TEST_F(BadCheckpoint, ConfigIndexTopkZero) {
  edit_config([](Json& j) { j["index_topk"] = 0; });
  expect_refused({"config.json", "index_topk"});
}

TEST_F(BadCheckpoint, ConfigInconsistentGroups) {
  edit_config([](Json& j) { j["o_groups"] = 3; });
  expect_refused({"config.json", "o_groups"});
}

TEST_F(BadCheckpoint, ConfigMissingField) {
  edit_config([](Json& j) { j.erase("head_dim"); });
  expect_refused({"config.json", "head_dim", "missing"});
}

TEST_F(BadCheckpoint, ConfigNotJson) {
  write_file(dir_ + "/config.json", "{\"hidden_size\": 256,");
  expect_refused({"config.json", "not valid JSON"});
}

TEST_F(BadCheckpoint, HashLayerCountChangesSchema) {
  // One more hash layer means layer 2 needs tid2eid and must not have gate.bias: both reported.
  edit_config([](Json& j) { j["num_hash_layers"] = 3; });
  auto r = test::run_dsv4("inspect " + dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("layers.2.ffn.gate.tid2eid is missing"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layers.2.ffn.gate.bias is not part of the model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(2 problems)"), std::string::npos) << r.err;
}

// Structurally valid but holding NaN encodings: refused when the weights load.
TEST_F(BadCheckpoint, NanCodesInWeights) {
  Shard s = read_shard(shard(1));
  const size_t wq_a = s.header["layers.0.attn.wq_a.weight"]["data_offsets"][0].get<size_t>();
  s.data[wq_a + 5] = static_cast<char>(0xFF);
  write_shard(shard(1), s);
  auto r = test::run_dsv4("generate -m " + dir_ + " --tokens 1,2 -n 1 --greedy --print-ids");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tensor layers.0.attn.wq_a.weight holds a NaN encoding (0xFF) at index 5"), std::string::npos)
      << r.err;
  s = read_shard(shard(1));
  s.data[s.header["layers.0.attn.wkv.scale"]["data_offsets"][0].get<size_t>()] = static_cast<char>(0xFF);
  s.data[wq_a + 5] = 0;
  write_shard(shard(1), s);
  r = test::run_dsv4("generate -m " + dir_ + " --tokens 1,2 -n 1 --greedy --print-ids");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tensor layers.0.attn.wkv.scale holds the E8M0 scale 0xFF (NaN) at index 0"), std::string::npos)
      << r.err;
}

// The load scans tensors in blocks of 4096 elements: a bad value deep inside a tensor is
// found and named with its exact index (FP8 weight: a later block; BF16 head: its last value).
TEST_F(BadCheckpoint, BadValueInALaterBlockIsNamed) {
  const size_t fp8_index = 3 * 4096 + 17;
  edit_shard(1, [&](Shard& s) {
    s.data[s.header["layers.0.attn.wq_a.weight"]["data_offsets"][0].get<size_t>() + fp8_index] = 0x7F;
  });
  auto r = test::run_dsv4("generate -m " + dir_ + " --tokens 1,2 -n 1 --greedy --print-ids");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tensor layers.0.attn.wq_a.weight holds a NaN encoding (0x7F) at index " +
                       std::to_string(fp8_index)),
            std::string::npos)
      << r.err;

  int64_t last = 0;  // the head loads before the layers, so its error comes first now
  edit_shard(2, [&](Shard& s) {
    const auto& head = s.header["head.weight"];
    last = head["shape"][0].get<int64_t>() * head["shape"][1].get<int64_t>() - 1;
    const size_t at = head["data_offsets"][0].get<size_t>() + size_t(last) * 2;
    s.data[at] = static_cast<char>(0xC0);  // BF16 0xFFC0 = NaN
    s.data[at + 1] = static_cast<char>(0xFF);
  });
  r = test::run_dsv4("generate -m " + dir_ + " --tokens 1,2 -n 1 --greedy --print-ids");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tensor head.weight holds a non-finite value at index " + std::to_string(last)),
            std::string::npos)
      << r.err;
}

// The embedding is read a row per token, so a non-finite value in it is refused when that
// row is used, naming the tensor and the element.
TEST_F(BadCheckpoint, NonFiniteEmbeddingRow) {
  const Json index = Json::parse(read_file(dir_ + "/model.safetensors.index.json"));
  const std::string file = index["weight_map"]["embed.weight"].get<std::string>();
  const int n = file[file.size() - std::string("-of-00003.safetensors").size() - 1] - '0';
  Shard s = read_shard(shard(n));
  const auto& embed = s.header["embed.weight"];
  const int64_t D = embed["shape"][1].get<int64_t>();
  const size_t at = embed["data_offsets"][0].get<size_t>() + size_t(2 * D + 3) * 2;  // token 2, element 3
  s.data[at] = static_cast<char>(0x80);  // BF16 0x7F80 = +inf
  s.data[at + 1] = static_cast<char>(0x7F);
  write_shard(shard(n), s);
  auto r = test::run_dsv4("generate -m " + dir_ + " --tokens 1,2 -n 1 --greedy --print-ids");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tensor embed.weight holds a non-finite value at index " + std::to_string(2 * D + 3)),
            std::string::npos)
      << r.err;
}

TEST_F(BadCheckpoint, NotADirectory) {
  auto r = test::run_dsv4("inspect " + dir_ + "/config.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos);
}

TEST_F(BadCheckpoint, EmptyFile) {
  write_file(shard(3), "");
  expect_refused({"model-00003-of-00003.safetensors", "too short"});
}


// Weight buffers: small ones 4 KiB aligned, big ones on a 2 MiB boundary (huge pages), all
// writable end to end and movable.
TEST(AlignedBuffer, AlignmentAndOwnership) {
  AlignedBuffer small(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 4096, 0u);
  const size_t big_size = (size_t{5} << 20) + 123;
  AlignedBuffer big(big_size);
  EXPECT_EQ(big.size(), big_size);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % (size_t{2} << 20), 0u);
  std::memset(big.data(), 0x5a, big_size);
  EXPECT_EQ(big.data()[big_size - 1], 0x5a);
  AlignedBuffer moved(std::move(big));
  EXPECT_EQ(moved.data()[0], 0x5a);
  AlignedBuffer other;
  other = std::move(moved);
  EXPECT_EQ(other.size(), big_size);
}

// Whole-tensor reads: O_DIRECT through the bounce buffer (or buffered where the filesystem
// refuses it) give exactly the file's bytes at any offset and length, across bounce chunks.
TEST(BulkReader, ReadsExactBytesAtAnyOffset) {
  test::TempDir tmp;
  std::vector<std::string> dirs = {tmp.path()};
  if (is_directory("/dev/shm")) dirs.push_back("/dev/shm");  // tmpfs: may refuse O_DIRECT
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    const std::string path = dir + "/dsv4-bulk-reader-test.bin";
    std::string bytes((size_t{37} << 20) + 4321, '\0');
    uint32_t x = 12345;
    for (char& c : bytes) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
    test::write_file(path, bytes);
    File file = File::open_read(path);
    BulkReader reader;
    const std::pair<uint64_t, uint64_t> ranges[] = {
        {0, bytes.size()}, {1, (size_t{33} << 20) + 7}, {4095, 300000}, {bytes.size() - 262149, 262149}, {17, 100}};
    for (auto [offset, length] : ranges) {
      std::vector<char> got(length);
      reader.read(file, got.data(), length, offset);
      EXPECT_EQ(std::memcmp(got.data(), bytes.data() + offset, length), 0) << offset << " + " << length;
    }
    std::vector<char> past(300000);
    EXPECT_THROW(reader.read(file, past.data(), past.size(), bytes.size() - 1000), Error);
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace dsv4
