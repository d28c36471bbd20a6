// Storage that survives a streamed generation: a read fault at each point of it (load, prefill,
// decode, a verify pass) fails only that request, in the engine, the CLI and the server;
// mirrors give bit-identical logits; spread checkpoints and mirror flags on the command line.
// storage_test.cc tests the store itself.
#include <gtest/gtest.h>
#include <httplib.h>

#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "dsv4/experts/expert_store.h"
#include "dsv4/platform/read_queue.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/server/http_server.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/util/error.h"
#include "dsv4/util/io_faults.h"
#include "test_util.h"
#include "storage_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using test::fixture;
using namespace storage_test;

// ---- faults at each point of a streamed generation ---------------------------------------------

GenerationResult greedy(Engine& e, const std::vector<int32_t>& prompt, int n) {
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = n;
  r.chunk = 4;
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  SessionState s = e.new_session();
  return generate(e, s, r, cb);
}


// An expert first needed in prefill, and one first needed in decode, of greedy(prompt, 6).
struct FirstUses {
  std::pair<int, int> prefill, decode;
  std::vector<int32_t> tokens;  // the fault-free output
};

FirstUses first_uses(const std::string& dir, const std::vector<int32_t>& prompt, int n) {
  auto recording = std::make_unique<RecordingExperts>(Checkpoint::open(dir));
  RecordingExperts* t = recording.get();
  EngineOptions o;
  o.numerics = kernels::Numerics::kReference;
  o.threads = 1;
  auto engine = test::open_engine(dir, o, std::move(recording));
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = 1;
  r.chunk = 4;
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t) { return std::string(); };
  SessionState s = engine->new_session();
  generate(*engine, s, r, cb);  // prefill only
  const std::set<std::pair<int, int>> in_prefill(t->acquired.begin(), t->acquired.end());
  FirstUses f;
  f.prefill = *in_prefill.begin();
  const size_t seen = t->acquired.size();
  f.tokens = greedy(*engine, prompt, n).tokens;
  bool found = false;
  for (size_t i = seen; i < t->acquired.size() && !found; ++i) {
    if (!in_prefill.count(t->acquired[i])) {
      f.decode = t->acquired[i];
      found = true;
    }
  }
  EXPECT_TRUE(found) << "no expert is first needed in decode";
  return f;
}

// At load (dense weights), prefill and decode, with either read queue: the generation fails
// with the error naming the expert and file; the same engine then serves the next request;
// and with a mirror the output is bit-identical to the fault-free run.
TEST(StorageFaults, AtEveryPointOfAStreamedGeneration) {
  Copy primary("tiny-a"), mirror("tiny-a", "mirror");
  const std::vector<int32_t> prompt = {496, 499, 84, 101, 288};
  const FirstUses uses = first_uses(primary.dir, prompt, 6);
  Checkpoint ck = Checkpoint::open(primary.dir);
  for (IoBackend backend : kBackends) {
    SCOPED_TRACE(name(backend));
    // Load: a dense tensor's read fails; the engine does not open.
    const TensorRef& head = ck.get("head.weight");
    auto load_fault = IoFaults::parse(fmt::format("eio:path={}:offset={}", head.shard->path(), head.info->offset + 100),
                                      "test");
    try {
      load_engine(primary.dir, streamed(backend, load_fault));
      ADD_FAILURE() << "a failed read at load must fail the load";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), head.shard->path())) << e.what();
      EXPECT_TRUE(contains(e.what(), "Input/output error")) << e.what();
    }
    for (const auto& [point, expert] : {std::pair{"prefill", uses.prefill}, std::pair{"decode", uses.decode}}) {
      SCOPED_TRACE(point);
      for (const char* kind : {"eio", "eof"}) {
        auto faults = IoFaults::parse(fault_on_expert(ck, kind, expert.first, expert.second, ":count=0"), "test");
        auto engine = load_engine(primary.dir, streamed(backend, faults)).engine;
        try {
          greedy(*engine, prompt, 6);
          ADD_FAILURE() << "the generation must fail";
        } catch (const Error& e) {
          EXPECT_TRUE(contains(e.what(), fmt::format("expert {} of layer {}: {}", expert.second, expert.first,
                                                     locate_expert(ck, expert.first, expert.second).parts[0].shard->path())))
              << e.what();
        }
        faults->clear();
        EXPECT_EQ(greedy(*engine, prompt, 6).tokens, uses.tokens);  // the next request works

        // With a mirror the failing read is served there: same tokens, no error. (Every read
        // tries the checkpoint's folder first, so the fault is met.)
        LoadOptions with_mirror = streamed(backend, IoFaults::parse(fault_on_expert(ck, kind, expert.first,
                                                                                      expert.second, ":count=0"),
                                                                      "test"));
        with_mirror.store.mirrors = {mirror.dir};
        with_mirror.store.read_shares = {1, 0};
        auto mirrored = load_engine(primary.dir, with_mirror).engine;
        EXPECT_EQ(greedy(*mirrored, prompt, 6).tokens, uses.tokens);
        EXPECT_GE(mirrored->experts().stats().read_retries, 1u);
      }
    }
  }
}

// A read fault during a speculative verify pass of several draft rows: the generation fails
// with the expert's error, and the session (which held an earlier turn) is rewound bit for bit
// to where the generation started; the same session then gives the fault-free tokens.
TEST(StorageFaults, AFailedVerifyPassRewindsTheSession) {
  Copy primary("tiny-a");
  const std::vector<int32_t> prompt = {496, 499, 84, 101, 288};
  const FirstUses uses = first_uses(primary.dir, prompt, 6);
  Checkpoint ck = Checkpoint::open(primary.dir);
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = 6;
  r.chunk = 4;
  // Oracle drafts, all right: the first decode pass feeds the first token and 4 drafts, every
  // decode feed of greedy(prompt, 6), so the expert first needed in decode fails inside it.
  r.spec = SpecMode::kOracle;
  r.draft_max = 4;
  r.oracle = uses.tokens;
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  for (IoBackend backend : kBackends) {
    SCOPED_TRACE(name(backend));
    auto faults = IoFaults::parse(fault_on_expert(ck, "eio", uses.decode.first, uses.decode.second, ":count=0"), "test");
    auto engine = load_engine(primary.dir, streamed(backend, faults)).engine;
    SessionState s = engine->new_session();
    // An earlier turn: the prompt's first tokens (their experts are a subset of the prefill's).
    engine->forward(s, std::span<const int32_t>(prompt).first(3), nullptr, LogitRows::kLast);
    const SessionState before = s;
    try {
      generate(*engine, s, r, cb);
      ADD_FAILURE() << "the generation must fail";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), fmt::format("expert {} of layer {}", uses.decode.second, uses.decode.first)))
          << e.what();
    }
    test::expect_same_session(s, before);
    faults->clear();
    const GenerationResult again = generate(*engine, s, r, cb);
    EXPECT_EQ(again.tokens, uses.tokens);
    EXPECT_GT(again.stats.accepted_tokens, 0);
  }
}

// Logits with mirrors (experts shared between the folders whole, or each read in pieces from
// both, and with every read of the checkpoint's folder failing) are bit-identical to the
// resident ones, on every fixture.
TEST(StorageFaults, MirrorsGiveBitIdenticalLogits) {
  for (const char* fixture_name : {"tiny-a", "flashlike"}) {
    SCOPED_TRACE(fixture_name);
    Copy primary(fixture_name), mirror(fixture_name, "mirror");
    const std::vector<int32_t> tokens = long_prompt();
    EngineOptions resident;
    resident.numerics = kernels::Numerics::kReference;
    resident.threads = 1;
    const std::vector<float> want = score(*test::open_engine(primary.dir, resident), tokens);
    const Checkpoint ck = Checkpoint::open(primary.dir);
    for (const char* mode : {"whole", "split", "failing"}) {
      SCOPED_TRACE(mode);
      const bool failing = std::string(mode) == "failing";
      auto faults = std::make_shared<IoFaults>();
      LoadOptions o = streamed(IoBackend::kAuto, faults);
      o.store.mirrors = {mirror.dir};
      o.store.read_shares = {1, 1};
      if (std::string(mode) != "whole") o.store.min_piece_bytes = 4096;  // windows in pieces from both folders
      auto engine = load_engine(primary.dir, o).engine;
      // The checkpoint's drive fails after the load: every read of its expert shards fails.
      // (The embedding's shard is left alone: embedding rows are read from the checkpoint's
      // own copy, and only expert reads go to mirrors.)
      if (failing) {
        const std::string embed = ck.get("embed.weight").shard->path();
        std::string rules;
        for (const auto& shard : ck.shards())
          if (shard->path() != embed) rules += "eio:count=0:path=" + shard->path() + ";";
        faults->set_rules(IoFaults::parse_rules(rules, "test"));
      }
      const std::vector<float> got = score(*engine, tokens);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
      const ExpertStats st = engine->experts().stats();
      ASSERT_EQ(st.folder_bytes.size(), 2u);
      EXPECT_GT(st.folder_bytes[1], 0u);  // the mirror served reads
      if (!failing) {
        EXPECT_GT(st.folder_bytes[0], 0u);
      }
      if (std::string(mode) == "whole") {
        EXPECT_EQ(st.read_pieces, st.read_windows);
      } else if (std::string(mode) == "split") {
        EXPECT_GT(st.read_pieces, st.read_windows);
      }
    }
  }
}

// The command line: a fault at load, prefill or decode exits 1 with the one-line error.
TEST(StorageFaults, TheCliExitsNonZeroWithTheSameMessage) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  const ExpertLocation loc = locate_expert(ck, 1, 0);
  const std::string rule = fault_on_expert(ck, "eio", 1, 0, ":count=0");
  ::setenv("DSV4_TEST_IO_FAULTS", rule.c_str(), 1);
  auto r = test::run_dsv4("generate -m " + fixture("tiny-a") + " --tokens " +
                          [] {
                            std::string s;
                            for (int32_t t : long_prompt()) s += (s.empty() ? "" : ",") + std::to_string(t);
                            return s;
                          }() +
                          " -n 2 --ram min");
  ::setenv("DSV4_TEST_IO_FAULTS", "eio:count=x", 1);
  auto bad = test::run_dsv4("generate -m " + fixture("tiny-a") + " --tokens 1,2 -n 1 --ram min");
  ::unsetenv("DSV4_TEST_IO_FAULTS");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "dsv4: error: expert 0 of layer 1: " + loc.parts[0].shard->path() +
                                  ": expert read of ")) << r.err;
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(contains(bad.err, "DSV4_TEST_IO_FAULTS")) << bad.err;
}

// ---- the server ------------------------------------------------------------------------------

// A server for `engine` (named tiny-a) on a free loopback port, started, and a client for it.
struct ServedEngine {
  static server::ServerOptions options(const Engine& engine) {
    server::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.model_name = "tiny-a";
    so.defaults.vocab_size = static_cast<int32_t>(engine.config().vocab_size);
    return so;
  }
  ServedEngine(Engine& engine, const text::Tokenizer& tokenizer)
      : server(engine, tokenizer, options(engine)), client("127.0.0.1", server.bind()) {
    server.start();
    client.set_read_timeout(120);
  }
  server::Server server;
  httplib::Client client;
};

// A request whose expert read fails gets a 5xx JSON error (or an error event when streaming)
// naming the expert; /health says degraded with the reason; once the fault is gone the server
// answers the same request as a fault-free server, and /health is ok again.
TEST(StorageFaults, TheServerFailsTheRequestAndKeepsServing) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  text::Tokenizer tokenizer = text::Tokenizer::from_file(fixture("tiny-a") + "/tokenizer.json");
  const std::string prompt = "Hi";
  // /v1/completions puts the BOS in front of a text prompt.
  const FirstUses uses = first_uses(fixture("tiny-a"), tokenizer.encode(std::string(text::chat::kBos) + prompt), 6);
  for (IoBackend backend : kBackends) {
    for (const auto& expert : {uses.prefill, uses.decode}) {
      SCOPED_TRACE(fmt::format("{} expert {} of layer {}", name(backend), expert.second, expert.first));
      auto faults = IoFaults::parse(fault_on_expert(ck, "eio", expert.first, expert.second, ":count=0"), "test");
      auto engine = load_engine(fixture("tiny-a"), streamed(backend, faults)).engine;
      ServedEngine served(*engine, tokenizer);
      httplib::Client& client = served.client;
      nlohmann::json body = {{"model", "tiny-a"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}};
      auto r = client.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 500);
      const auto error = nlohmann::json::parse(r->body, nullptr, false);
      EXPECT_EQ(error["error"]["type"], "server_error") << r->body;
      EXPECT_TRUE(contains(error["error"]["message"].get<std::string>(),
                           fmt::format("expert {} of layer {}: ", expert.second, expert.first)))
          << r->body;
      body["stream"] = true;
      auto sr = client.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(sr);
      EXPECT_TRUE(contains(sr->body, "\"server_error\"")) << sr->body;
      auto health = nlohmann::json::parse(client.Get("/health")->body);
      EXPECT_EQ(health["status"], "degraded");
      EXPECT_TRUE(contains(health["reason"].get<std::string>(), fmt::format("expert {} of layer {}", expert.second,
                                                                          expert.first)))
          << health.dump();
      faults->clear();
      body["stream"] = false;
      auto ok = client.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(ok);
      EXPECT_EQ(ok->status, 200) << ok->body;
      EXPECT_EQ(nlohmann::json::parse(ok->body)["usage"]["completion_tokens"], 6);
      EXPECT_EQ(nlohmann::json::parse(client.Get("/health")->body)["status"], "ok");
      served.server.stop();
    }
  }
}

// A bad expert scale (0xFF NaN, 0xFE 2^127) met by a streamed request: a 5xx JSON error naming
// the layer and expert, no logits; /health says degraded; a request that does not need the
// expert is still answered.
TEST(ExpertValues, TheServerAnswersABadScaleWith5xxJson) {
  for (uint8_t code : {uint8_t{0xFF}, uint8_t{0xFE}}) {
    SCOPED_TRACE(static_cast<int>(code));
    Copy c("tiny-a");
    corrupt_scale(c.dir, {2, 5, code});
    text::Tokenizer tokenizer = text::Tokenizer::from_file(fixture("tiny-a") + "/tokenizer.json");
    auto engine = load_engine(c.dir, streamed(IoBackend::kAuto)).engine;
    ServedEngine served(*engine, tokenizer);
    httplib::Client& client = served.client;
    nlohmann::json body = {{"model", "tiny-a"}, {"prompt", long_prompt()}, {"max_tokens", 2}, {"temperature", 0}};
    auto r = client.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_GE(r->status, 500);
    const auto error = nlohmann::json::parse(r->body, nullptr, false);
    ASSERT_TRUE(error.is_object()) << r->body;
    EXPECT_TRUE(contains(error["error"]["message"].get<std::string>(), "expert 5 of layer 2: ")) << r->body;
    EXPECT_TRUE(contains(error["error"]["message"].get<std::string>(), "E8M0 scale")) << r->body;
    EXPECT_FALSE(error.contains("choices")) << r->body;
    EXPECT_EQ(nlohmann::json::parse(client.Get("/health")->body)["status"], "degraded");
    body["prompt"] = short_prompt();
    auto ok = client.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    served.server.stop();
  }
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// A checkpoint whose shards are spread over two folders loads with --mirror naming the
// other; a --mirror that is a full copy gives the same output; bad --read-shares are named.
TEST(Mirrors, SpreadCheckpointsAndMirrorFlagsOnTheCommandLine) {
  Copy spread("tiny-a");
  const std::string other = spread.tmp / "other";
  fs::create_directories(other);
  for (const char* shard : {"model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"})
    fs::rename(spread.dir + "/" + shard, other + "/" + shard);
  const std::string args = " --tokens 496,10,20,30 -n 6 --greedy --print-ids";
  auto want = test::run_dsv4("generate -m " + fixture("tiny-a") + args);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  auto missing = test::run_dsv4("generate -m " + spread.dir + args);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(contains(missing.err, "shard model-00002-of-00003.safetensors named in the index does not exist"))
      << missing.err;
  for (const char* ram : {"64G", "min"}) {
    auto r = test::run_dsv4("generate -m " + spread.dir + " --mirror " + other + " --ram " + ram + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want.out) << ram;
  }
  auto inspect = test::run_dsv4("inspect " + spread.dir + " --mirror " + other);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_TRUE(contains(inspect.out, other + "/model-00002-of-00003.safetensors")) << inspect.out;

  auto mirrored = test::run_dsv4("generate -m " + fixture("tiny-a") + " --mirror " + spread.dir + " --mirror " + other +
                                 " --ram min --read-shares 1,1,1" + args);
  EXPECT_EQ(mirrored.exit_code, 0) << mirrored.err;
  EXPECT_EQ(mirrored.out, want.out);
  for (const char* shares : {"1,x", "1,-1", "1"}) {
    auto bad = test::run_dsv4("generate -m " + fixture("tiny-a") + " --mirror " + spread.dir + " --ram min --read-shares " +
                              shares + args);
    EXPECT_EQ(bad.exit_code, 1) << shares;
    EXPECT_TRUE(contains(bad.err, "--read-shares")) << bad.err;
  }
}

}  // namespace
}  // namespace dsv4