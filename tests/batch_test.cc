// Continuous batching: rows of several sessions share each pass over the weights, and every
// session gets exactly what it gets alone — tokens, logits and final state, bit for bit —
// whatever else is in the pass: 2-8 sessions, joining and leaving at different steps,
// prompt chunks beside decode rows, greedy and seeded sampling, all experts resident and at
// --ram min (streamed experts), one pass at a time (forward_batch) and from threads that
// share passes through the engine's batch queue (join_batch), speculative verify passes too.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dsv4/io/checkpoint.h"
#include "dsv4/model/engine.h"
#include "dsv4/util/error.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/runtime/sampler.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::fixture;

struct Setup {
  std::string fixture;
  std::string ram;  // "" resident, "min" streamed
  kernels::Numerics numerics;
};

void PrintTo(const Setup& s, std::ostream* os) {
  *os << s.fixture << (s.ram.empty() ? " resident" : " --ram " + s.ram)
      << (s.numerics == kernels::Numerics::kFast ? " fast" : " reference");
}

LoadedEngine open(const Setup& s, int64_t max_rows = 48, int64_t prompt_rows = 4) {
  LoadOptions o;
  o.engine.batch_prompt_rows = prompt_rows;
  o.engine.numerics = s.numerics;
  o.engine.threads = 2;
  o.engine.max_rows = max_rows;
  o.engine.context = 1024;
  o.engine.batch_wait_us = 200000;  // a loaded test machine: wait long for the other members
  o.ram = s.ram.empty() ? "64G" : s.ram;
  return load_engine(fixture(s.fixture), o);
}

// Prompts of different lengths from the fixture's reference sequences.
std::vector<std::vector<int32_t>> prompts(const std::string& name, int n) {
  nlohmann::json ref = nlohmann::json::parse(test::read_file(fixture(name) + "/reference.json"));
  std::vector<std::vector<int32_t>> all;
  for (const auto& s : ref["sequences"]) all.push_back(s["tokens"].get<std::vector<int32_t>>());
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = all[static_cast<size_t>(i) % all.size()];
    const size_t len = std::min<size_t>(p.size(), 5 + static_cast<size_t>(i) * 23 % 90);
    p.resize(len);
    p[0] = static_cast<int32_t>((p[0] + i) % 50 + 1);  // no two prompts alike
    out.push_back(p);
  }
  return out;
}

int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// One stream of the scripted schedule: its prompt, fed in chunks, then `steps` tokens.
struct Stream {
  std::vector<int32_t> prompt;
  int64_t chunk = 1;
  int steps = 0;
  int join = 0;       // the pass it first takes part in
  int every = 1;      // takes part in every `every`-th pass after joining
  bool greedy = true;
  uint64_t seed = 0;

  SessionState session;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> fed, generated;
  std::vector<float> logits, seen;  // the last logits; every decode step's logits
  int64_t prefilled = 0;
};

SamplingParams seeded(uint64_t seed) { return SamplingParams{.temperature = 0.9f, .top_k = 40, .seed = seed}; }

int32_t pick(bool greedy, Sampler* sampler, std::span<const float> logits, const std::vector<int32_t>& fed) {
  return greedy ? argmax(logits) : sampler->sample(logits, fed);
}

// The same stream alone: forward() the prompt, then a token at a time.
void run_alone(Engine& e, Stream& s, std::vector<float>& seen, std::vector<int32_t>& generated, SessionState& out) {
  const int64_t V = e.config().vocab_size;
  Sampler sampler(seeded(s.seed));
  std::vector<int32_t> fed = s.prompt;
  SessionState session = e.new_session();
  std::vector<float> logits(V);
  e.forward(session, s.prompt, logits.data(), LogitRows::kLast, 11);
  for (int i = 0; i < s.steps; ++i) {
    seen.insert(seen.end(), logits.begin(), logits.end());
    const int32_t next = pick(s.greedy, &sampler, logits, fed);
    generated.push_back(next);
    fed.push_back(next);
    if (i + 1 < s.steps) e.forward(session, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
  }
  out = std::move(session);
}

class BatchPass : public ::testing::TestWithParam<Setup> {};

// A scripted schedule of passes over 8 streams: each pass carries one row of every decoding
// stream that takes part and a prompt chunk of every prefilling one (so chunks of several
// sessions and decode rows share passes), within the workspace's rows.
TEST_P(BatchPass, EveryStreamAsAlone) {
  LoadedEngine loaded = open(GetParam());
  Engine& e = *loaded.engine;
  const int64_t V = e.config().vocab_size;
  const auto ps = prompts(GetParam().fixture, 8);
  std::vector<Stream> streams(8);
  for (size_t i = 0; i < streams.size(); ++i) {
    Stream& s = streams[i];
    s.prompt = ps[i];
    s.chunk = 1 + static_cast<int64_t>(i * 7 % 13);
    s.steps = 3 + static_cast<int>(i * 5 % 9);
    s.join = static_cast<int>(i * 3 % 7);
    s.every = i % 3 == 2 ? 2 : 1;
    s.greedy = i % 2 == 0;
    s.seed = 1000 + i;
    s.session = e.new_session();
    s.sampler = std::make_unique<Sampler>(seeded(s.seed));
    s.fed = s.prompt;
    s.logits.resize(static_cast<size_t>(V));
  }
  int64_t most_parts = 0, mixed = 0;
  for (int pass = 0;; ++pass) {
    std::vector<BatchItem> items;
    std::vector<std::vector<int32_t>> rows(streams.size());
    std::vector<Stream*> in;
    int64_t used = 0;
    bool any_left = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      Stream& s = streams[i];
      const bool done = static_cast<int>(s.generated.size()) >= s.steps;
      if (done) continue;
      any_left = true;
      if (pass < s.join || (pass - s.join) % s.every != 0) continue;
      const int64_t prompt_len = static_cast<int64_t>(s.prompt.size());
      if (s.prefilled < prompt_len) {
        const int64_t n = std::min({s.chunk, prompt_len - s.prefilled, e.max_rows() - used});
        if (n <= 0) continue;
        rows[i].assign(s.prompt.begin() + s.prefilled, s.prompt.begin() + s.prefilled + n);
      } else {
        if (used + 1 > e.max_rows()) continue;
        rows[i] = {s.generated.back()};
      }
      used += static_cast<int64_t>(rows[i].size());
      const bool last_chunk = s.prefilled < prompt_len && s.prefilled + static_cast<int64_t>(rows[i].size()) == prompt_len;
      const bool decode = s.prefilled >= prompt_len;
      items.push_back(BatchItem{&s.session, rows[i], last_chunk || decode ? s.logits.data() : nullptr, LogitRows::kLast});
      in.push_back(&s);
    }
    if (!any_left) break;
    ASSERT_LT(pass, 1000);
    if (items.empty()) continue;
    most_parts = std::max<int64_t>(most_parts, static_cast<int64_t>(items.size()));
    bool has_chunk = false, has_decode = false;
    for (const BatchItem& item : items) (item.tokens.size() > 1 ? has_chunk : has_decode) = true;
    mixed += has_chunk && has_decode;
    e.forward_batch(items);
    for (size_t k = 0; k < items.size(); ++k) {
      Stream& s = *in[k];
      const bool was_prefill = s.prefilled < static_cast<int64_t>(s.prompt.size());
      if (was_prefill) s.prefilled += static_cast<int64_t>(items[k].tokens.size());
      if (!items[k].logits) continue;
      s.seen.insert(s.seen.end(), s.logits.begin(), s.logits.end());
      const int32_t next = pick(s.greedy, s.sampler.get(), s.logits, s.fed);
      s.generated.push_back(next);
      s.fed.push_back(next);
    }
  }
  EXPECT_GE(most_parts, 4);
  EXPECT_GT(mixed, 0) << "no pass had prompt chunks beside decode rows";
  for (size_t i = 0; i < streams.size(); ++i) {
    Stream& s = streams[i];
    std::vector<float> seen;
    std::vector<int32_t> generated;
    SessionState alone;
    run_alone(e, s, seen, generated, alone);
    EXPECT_EQ(s.generated, generated) << "stream " << i;
    ASSERT_EQ(s.seen.size(), seen.size()) << "stream " << i;
    EXPECT_EQ(std::memcmp(s.seen.data(), seen.data(), seen.size() * sizeof(float)), 0) << "stream " << i;
    test::expect_same_session(s.session, alone);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchPass,
                         ::testing::Values(Setup{"tiny-a", "", kernels::Numerics::kFast},
                                           Setup{"tiny-a", "min", kernels::Numerics::kReference},
                                           Setup{"flashlike", "", kernels::Numerics::kFast},
                                           Setup{"flashlike", "min", kernels::Numerics::kFast}));

// Whole generations from threads that share passes (the server's and the benchmark's way):
// 2..8 concurrent requests, started at different times and of different lengths (so they
// join and leave while others run), greedy and seeded, one with n-gram drafting (its verify
// passes share passes too): each gets exactly the tokens and logits it gets alone.
class BatchThreads : public ::testing::TestWithParam<std::tuple<Setup, int>> {};

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

GenerationRequest request_for(const std::vector<int32_t>& prompt, int i) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = 4 + i * 3 % 7;
  r.chunk = 1 + i * 5 % 11;
  if (i % 2 == 1) r.sampling = SamplingParams{.temperature = 0.8f, .top_p = 0.9f, .seed = 77u + static_cast<uint64_t>(i)};
  else r.sampling.temperature = 0;
  if (i == 2) r.spec = SpecMode::kNgram;
  return r;
}

Outcome generate_one(Engine& e, const GenerationRequest& r) {
  Outcome o;
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  cb.on_logits = [&](std::span<const float> row) { o.logits.insert(o.logits.end(), row.begin(), row.end()); };
  SessionState s = e.new_session();
  o.tokens = generate(e, s, r, cb).tokens;
  return o;
}

TEST_P(BatchThreads, GenerationsAsAlone) {
  const auto [setup, n] = GetParam();
  LoadedEngine loaded = open(setup);
  Engine& e = *loaded.engine;
  const auto ps = prompts(setup.fixture, n);
  std::vector<Outcome> alone;
  for (int i = 0; i < n; ++i) alone.push_back(generate_one(e, request_for(ps[static_cast<size_t>(i)], i)));

  const Engine::PassCounts before = e.pass_counts();
  std::vector<Outcome> together(static_cast<size_t>(n));
  {
    // Every member joins before any starts, so the first passes wait for all of them; the
    // later ones start after earlier generations' first tokens (they join a running batch).
    std::vector<Engine::BatchMember> members;
    for (int i = 0; i < n; ++i) members.push_back(e.join_batch());
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        Engine::BatchMember member = std::move(members[static_cast<size_t>(i)]);
        together[static_cast<size_t>(i)] = generate_one(e, request_for(ps[static_cast<size_t>(i)], i));
      });
    for (std::thread& t : threads) t.join();
  }
  const Engine::PassCounts after = e.pass_counts();
  EXPECT_GT(after.parts - before.parts, after.passes - before.passes) << "no pass was shared";
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(together[static_cast<size_t>(i)].tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
    const auto& a = alone[static_cast<size_t>(i)].logits;
    const auto& b = together[static_cast<size_t>(i)].logits;
    ASSERT_EQ(a.size(), b.size()) << "request " << i;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, BatchThreads,
    ::testing::Combine(::testing::Values(Setup{"tiny-a", "", kernels::Numerics::kFast},
                                         Setup{"tiny-a", "min", kernels::Numerics::kFast},
                                         Setup{"flashlike", "", kernels::Numerics::kFast},
                                         Setup{"flashlike", "min", kernels::Numerics::kReference}),
                       ::testing::Values(2, 8)));

// A prompt admitted while another session decodes goes into the shared passes at most
// batch_prompt_rows rows at a time (its chunk split over several passes), and both sessions
// still get exactly what they get alone: the decoding stream's logits at every step, and every
// row's logits of the prompt.
class BatchAdmission : public ::testing::TestWithParam<Setup> {};

TEST_P(BatchAdmission, APromptBesideADecodingStreamGoesInPartsOfTheRowBudget) {
  constexpr int64_t kPromptRows = 3, kChunk = 16;
  constexpr int kSteps = 40;
  const auto setup = GetParam();
  {
    LoadedEngine loaded = open(setup, 48, kPromptRows);
    Engine& e = *loaded.engine;
    const int64_t V = e.config().vocab_size;
    const auto ps = prompts(setup.fixture, 8);
    const std::vector<int32_t>& decoder_prompt = ps[0];
    std::vector<int32_t> admitted;  // 45 tokens: three chunks, the last one ragged
    for (size_t i = 1; admitted.size() < 45; i = i % 7 + 1)
      for (int32_t t : ps[i]) admitted.push_back(t);
    admitted.resize(45);

    auto decode = [&](std::vector<float>& seen, const std::function<void()>& after_first) {
      SessionState s = e.new_session();
      std::vector<float> logits(static_cast<size_t>(V));
      e.forward(s, decoder_prompt, logits.data(), LogitRows::kLast, 5);
      for (int i = 0; i < kSteps; ++i) {
        seen.insert(seen.end(), logits.begin(), logits.end());
        const int32_t next = argmax(logits);
        e.forward(s, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
        if (i == 0 && after_first) after_first();
      }
    };
    auto admit = [&](std::vector<float>& rows) {
      SessionState s = e.new_session();
      rows.assign(admitted.size() * static_cast<size_t>(V), 0.0f);
      e.forward(s, admitted, rows.data(), LogitRows::kAll, kChunk);
    };
    std::vector<float> decoded_alone, admitted_alone;
    decode(decoded_alone, nullptr);
    admit(admitted_alone);

    const Engine::PassCounts before = e.pass_counts();
    std::vector<float> decoded, admitted_rows;
    {
      Engine::BatchMember m1 = e.join_batch(), m2 = e.join_batch();
      std::atomic<bool> decoding{false};
      std::thread decoder([&, m = std::move(m1)]() mutable {
        decode(decoded, [&] { decoding.store(true); });
        m.leave();
      });
      std::thread admitter([&, m = std::move(m2)]() mutable {
        while (!decoding.load()) std::this_thread::yield();
        admit(admitted_rows);
        m.leave();
      });
      decoder.join();
      admitter.join();
    }
    const Engine::PassCounts after = e.pass_counts();
    ASSERT_EQ(decoded.size(), decoded_alone.size());
    EXPECT_EQ(std::memcmp(decoded.data(), decoded_alone.data(), decoded.size() * sizeof(float)), 0);
    ASSERT_EQ(admitted_rows.size(), admitted_alone.size());
    EXPECT_EQ(std::memcmp(admitted_rows.data(), admitted_alone.data(), admitted_rows.size() * sizeof(float)), 0);
    EXPECT_GT(after.parts - before.parts, after.passes - before.passes) << "no pass was shared";
    EXPECT_GE(after.widest_shared, 2u);
    EXPECT_LE(after.widest_shared, static_cast<uint64_t>(1 + kPromptRows)) << "a shared pass carried a whole chunk";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchAdmission,
                         ::testing::Values(Setup{"tiny-a", "min", kernels::Numerics::kFast},
                                           Setup{"flashlike", "", kernels::Numerics::kFast}));

// dsv4 run --batch: every line's answer is what `dsv4 run` gives for that prompt alone, in
// input order, a bad line gets its error and the others still run.
TEST(RunBatch, EachLineAsItsOwnRun) {
  test::TempDir dir;
  const std::string in = dir / "prompts.jsonl", out = dir / "results.jsonl";
  test::write_file(in,
                   "{\"prompt\":\"Hi\",\"max_tokens\":5,\"temperature\":0.8,\"seed\":3}\n"
                   "{\"id\":\"b\",\"prompt\":\"the cat\",\"max_tokens\":7,\"temperature\":0}\n"
                   "{\"nope\":1}\n"
                   "\n"
                   "{\"prompt\":\"Tell me about the sea\",\"max_tokens\":9,\"temperature\":0}\n");
  const std::string model = "-m " + fixture("tiny-a");
  const test::CommandResult r = test::run_dsv4("run " + model + " --batch " + in + " --out " + out + " --parallel 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("4 prompts through 3 slots (1 blank line"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
  std::vector<nlohmann::json> lines;
  std::istringstream results(test::read_file(out));
  for (std::string l; std::getline(results, l);) lines.push_back(nlohmann::json::parse(l));
  // One result per physical line, the blank one too; default ids are 1-based line numbers.
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["id"], 1);
  EXPECT_EQ(lines[1]["id"], "b");
  EXPECT_EQ(lines[2]["id"], 3);
  EXPECT_NE(lines[2]["error"].get<std::string>().find("line 3: needs \"prompt\""), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3]["id"], 4);
  EXPECT_NE(lines[3]["error"].get<std::string>().find("line 4: blank line"), std::string::npos) << lines[3];
  EXPECT_EQ(lines[4]["id"], 5);
  const char* alone[] = {"--max-tokens 5 --temperature 0.8 --seed 3 Hi", "--max-tokens 7 --temperature 0 'the cat'", "",
                         "", "--max-tokens 9 --temperature 0 'Tell me about the sea'"};
  for (int i : {0, 1, 4}) {
    const test::CommandResult one = test::run_dsv4("run " + model + " --json " + alone[i]);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const nlohmann::json j = nlohmann::json::parse(one.out);
    EXPECT_EQ(lines[static_cast<size_t>(i)]["tokens"], j["tokens"]) << "line " << i;
    EXPECT_EQ(lines[static_cast<size_t>(i)]["text"], j["text"]) << "line " << i;
  }
  EXPECT_NE(test::run_dsv4("run " + model + " --batch " + in).err.find("--batch needs --out"), std::string::npos);
}

// Bad lines are named by their physical line number (blank lines count), each with its own
// error: an empty "messages", invalid UTF-8 (named as such, with its byte), a blank line of
// spaces and a CR; the good line after them still runs, with its line number as its id.
TEST(RunBatch, BadLinesNamedByPhysicalLineNumber) {
  test::TempDir dir;
  const std::string in = dir / "prompts.jsonl", out = dir / "results.jsonl";
  test::write_file(in,
                   "\n"
                   "{\"messages\": []}\n"
                   "{\"prompt\":\"caf\xc3\"}\n"
                   "  \r\n"
                   "{\"prompt\":\"the cat\",\"max_tokens\":2,\"temperature\":0}\n");
  const test::CommandResult r =
      test::run_dsv4("run -m " + fixture("tiny-a") + " --batch " + in + " --out " + out + " --parallel 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<nlohmann::json> lines;
  std::istringstream results(test::read_file(out));
  for (std::string l; std::getline(results, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 5u) << test::read_file(out);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["id"], i + 1) << lines[i];
  auto error = [&](size_t i) { return lines[i].value("error", std::string()); };
  EXPECT_NE(error(0).find("prompts.jsonl line 1: blank line"), std::string::npos) << lines[0];
  EXPECT_NE(error(1).find("line 2: \"messages\" must be a non-empty array"), std::string::npos) << lines[1];
  EXPECT_NE(error(2).find("line 3: invalid UTF-8 at byte 15"), std::string::npos) << lines[2];
  EXPECT_NE(error(3).find("line 4: blank line"), std::string::npos) << lines[3];
  EXPECT_FALSE(lines[4].contains("error")) << lines[4];
  EXPECT_FALSE(lines[4]["tokens"].empty()) << lines[4];
}

// Resident experts that fail `faults` acquires of one expert, and record what was acquired.
class FaultyExperts final : public ExpertProvider {
 public:
  explicit FaultyExperts(const Checkpoint& ck) : inner_(make_resident_experts(ck)) {}
  void prefetch(int layer, std::span<const int> experts) override { inner_->prefetch(layer, experts); }
  const ExpertWeights& acquire(int layer, int expert) override {
    if (layer == fault_layer && expert == fault_expert && faults > 0) {
      --faults;
      fail("expert {} of layer {}: the test's read fault", expert, layer);
    }
    acquired.insert(acquired.end(), {layer, expert});
    return inner_->acquire(layer, expert);
  }
  void release(int layer, int expert) override { inner_->release(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  int fault_layer = -1, fault_expert = -1, faults = 0;
  std::vector<std::pair<int, int>> acquired;

 private:
  std::unique_ptr<ExpertProvider> inner_;
};

// A fault in a shared pass costs only the request it belongs to: the pass is taken back in
// both sessions and each request rerun alone; the faulty one fails with the expert's error
// and its session is as before the pass, the other gets exactly its results alone.
TEST(BatchFaults, AFaultInASharedPassFailsOnlyItsRequest) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  auto provider = std::make_unique<FaultyExperts>(ck);
  FaultyExperts& experts = *provider;
  EngineOptions o;
  o.threads = 2;
  o.batch_wait_us = 2000000;
  auto engine = test::open_engine(fixture("tiny-a"), o, std::move(provider));
  Engine& e = *engine;
  const int64_t V = e.config().vocab_size;
  const auto ps = prompts("tiny-a", 2);
  SessionState a = e.new_session(), b = e.new_session();
  std::vector<float> la(V), lb(V);
  e.forward(a, ps[0], la.data(), LogitRows::kLast);
  e.forward(b, ps[1], lb.data(), LogitRows::kLast);
  const int32_t ta = argmax(la), tb = argmax(lb);
  // What each next row acquires alone: a fault on an expert only a's row needs.
  auto acquired_by = [&](const SessionState& s, int32_t t) {
    SessionState copy = s;
    experts.acquired.clear();
    std::vector<float> l(V);
    e.forward(copy, std::span<const int32_t>(&t, 1), l.data(), LogitRows::kLast);
    return std::make_pair(experts.acquired, l);
  };
  const auto [used_a, alone_a] = acquired_by(a, ta);
  const auto [used_b, alone_b] = acquired_by(b, tb);
  for (const auto& x : used_a)
    if (std::find(used_b.begin(), used_b.end(), x) == used_b.end()) {
      experts.fault_layer = x.first;
      experts.fault_expert = x.second;
      break;
    }
  ASSERT_GE(experts.fault_layer, 0) << "no expert only the first row uses";
  experts.faults = 2;  // the shared pass and a's rerun alone
  const SessionState a_before = a;
  const Engine::PassCounts before = e.pass_counts();
  std::string error_a;
  bool b_failed = false;
  {
    Engine::BatchMember m1 = e.join_batch(), m2 = e.join_batch();
    std::thread first([&] {
      try {
        e.forward(a, std::span<const int32_t>(&ta, 1), la.data(), LogitRows::kLast);
      } catch (const Error& err) {
        error_a = err.what();
      }
    });
    std::thread second([&] {
      try {
        e.forward(b, std::span<const int32_t>(&tb, 1), lb.data(), LogitRows::kLast);
      } catch (const Error&) {
        b_failed = true;
      }
    });
    first.join();
    second.join();
  }
  const Engine::PassCounts after = e.pass_counts();
  EXPECT_EQ(experts.faults, 0) << "the shared pass and the rerun should both have met the fault";
  EXPECT_EQ(after.passes - before.passes, 1u) << "the shared pass failed before its count; b's rerun is the one";
  EXPECT_NE(error_a.find("the test's read fault"), std::string::npos) << error_a;
  EXPECT_FALSE(b_failed);
  EXPECT_EQ(std::memcmp(lb.data(), alone_b.data(), V * sizeof(float)), 0);
  test::expect_same_session(a, a_before);
  // a goes on as if nothing happened.
  e.forward(a, std::span<const int32_t>(&ta, 1), la.data(), LogitRows::kLast);
  EXPECT_EQ(std::memcmp(la.data(), alone_a.data(), V * sizeof(float)), 0);
}

}  // namespace
}  // namespace dsv4
