// dsv4 run --batch PROMPTS.jsonl --out RESULTS.jsonl: many prompts through --parallel slots
// that share each pass over the weights (Engine::join_batch), so offline throughput is that
// of continuous batching; every answer is exactly what `dsv4 run` gives for it alone. Each
// input line is a JSON object: "prompt" (text, chat-encoded as `dsv4 run` does; with "raw":
// true a plain continuation) or "messages" (a chat), and optionally "id", "max_tokens",
// "temperature", "top_p", "top_k", "seed". One output line per physical input line, in input
// order, blank lines included: "id" (default: the line's number, 1-based as an editor counts
// lines), "text", "tokens", "finish_reason", "stats" — or "error" for a line that failed (a
// blank line, a line over --batch-line-mb (skipped unread), invalid UTF-8, bad JSON, an empty
// "messages", a prompt over the context...; it names the line, and the others still run).
// Message text is plain text: special-token text in it is never a control token (a "raw" line
// may opt in with "special_tokens": true). Progress on stderr: done / total, tok/s, ETA.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/platform/platform.h"
#include "dsv4/cli/common.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/text/utf8.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/line_reader.h"
#include "dsv4/util/memory.h"
#include "dsv4/util/progress.h"

namespace dsv4::cli {
namespace {

namespace chat = text::chat;
using Json = nlohmann::json;

struct Line {
  Json id;
  GenerationRequest request;
  text::IncrementalDecoder::ShowSpecial show_special;  // which generated specials the text shows
  std::string error;  // a bad line: reported in its output line, never run
};

std::string eta_text(double s) {
  if (s <= 0) return "-";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60)
                   : t >= 60 ? fmt::format("{}m{:02d}s", t / 60, t % 60) : fmt::format("{}s", t);
}

using InputLine = BoundedLineReader::Line;

bool blank(const InputLine& l) { return !l.too_long && l.text.find_first_not_of(" \t\r") == std::string::npos; }

// `number`: the physical line number, 1-based. `limit`: the context, in tokens.
Line parse_line(const InputLine& input, size_t number, const std::string& path, const LoadedModel& lm,
                const GenerationRequest& defaults, const chat::EncodeOptions& eo, int64_t limit, int64_t line_mb) {
  Line line;
  line.id = number;
  line.request = defaults;
  const std::string& text = input.text;
  const std::string what = fmt::format("{} line {}: the prompt", path, number);
  try {
    if (input.too_long)
      fail("{} line {}: {} bytes, longer than --batch-line-mb {} MiB (skipped unread)", path, number, input.bytes, line_mb);
    if (blank(input)) fail("{} line {}: blank line (no prompt)", path, number);
    if (const size_t ok = text::valid_utf8_prefix(text); ok != text.size())
      fail("{} line {}: invalid UTF-8 at byte {} of the line", path, number, ok + 1);
    const Json j = Json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("{} line {}: not a JSON object", path, number);
    if (j.contains("id")) line.id = j["id"];
    GenerationRequest& r = line.request;
    if (j.contains("max_tokens")) r.max_tokens = j["max_tokens"].get<int64_t>();
    if (j.contains("temperature")) r.sampling.temperature = j["temperature"].get<float>();
    if (j.contains("top_p")) r.sampling.top_p = j["top_p"].get<float>();
    if (j.contains("top_k")) r.sampling.top_k = j["top_k"].get<int>();
    if (j.contains("seed")) r.sampling.seed = j["seed"].get<uint64_t>();
    r.sampling.validate();
    if (r.max_tokens < 1) fail("{} line {}: \"max_tokens\" must be at least 1", path, number);
    if (j.value("special_tokens", false) && !j.value("raw", false))
      fail("{} line {}: \"special_tokens\" needs \"raw\": true", path, number);
    line.show_special = chat::answer_specials(lm.tokenizer, eo.thinking_mode, false);
    if (j.contains("messages")) {
      const Json& m = j["messages"];
      if (!m.is_array() || m.empty()) fail("{} line {}: \"messages\" must be a non-empty array", path, number);
      const chat::Prompt p = chat::render_prompt(m, eo);
      r.prompt = encode_prompt(lm.tokenizer, p.text, p.caller, limit, what);
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      const std::string& p = j["prompt"].get_ref<const std::string&>();
      if (j.value("raw", false)) {
        const bool specials = j.value("special_tokens", false);
        const text::TextRange all{0, p.size()};
        r.prompt = {static_cast<int32_t>(lm.engine->config().bos_token_id)};
        const std::vector<int32_t> ids =
            encode_prompt(lm.tokenizer, p, specials ? std::span<const text::TextRange>() : std::span(&all, 1), limit - 1, what);
        r.prompt.insert(r.prompt.end(), ids.begin(), ids.end());
        line.show_special = specials ? text::IncrementalDecoder::ShowSpecial() : [](int32_t) { return false; };
      } else {
        const chat::Prompt chat_prompt = chat::render_prompt(Json::array({{{"role", "user"}, {"content", p}}}), eo);
        r.prompt = encode_prompt(lm.tokenizer, chat_prompt.text, chat_prompt.caller, limit, what);
      }
    } else {
      fail("{} line {}: needs \"prompt\" (a string) or \"messages\"", path, number);
    }
  } catch (const Json::exception& e) {
    line.error = fmt::format("{} line {}: {}", path, number, e.what());
  } catch (const Error& e) {
    line.error = e.what();
  }
  return line;
}

}  // namespace

int run_batch(const RunOptions& o, const chat::EncodeOptions& eo) {
  if (o.batch_out.empty()) fail("--batch needs --out RESULTS.jsonl");
  std::vector<InputLine> texts;
  {
    std::ifstream in(platform::fs_path(o.batch), std::ios::binary);
    if (!in) fail("{}: cannot open (--batch)", o.batch);
    BoundedLineReader reader(in, static_cast<size_t>(o.batch_line_mb) << 20);
    for (InputLine l; reader.next(l);) texts.push_back(std::move(l));  // every physical line, blank ones too
    if (reader.failed()) fail("{}: read failed (--batch)", o.batch);
  }
  if (std::all_of(texts.begin(), texts.end(), blank)) fail("{}: no prompts (--batch)", o.batch);
  std::FILE* out = platform::fopen_utf8(o.batch_out, "w");
  if (!out) fail("{}: cannot write (--out)", o.batch_out);

  WorkloadShape workload = interactive_workload(o.model);
  workload.sessions = o.parallel;  // 0: the plan picks the slot count
  const int64_t slots_guess = o.parallel > 0 ? o.parallel : kAutoSessions;
  const int64_t chunk = o.model.chunk > 0 ? o.model.chunk : kBatchedPromptChunk;
  workload.chunk_tokens = chunk + slots_guess * (1 + o.sampling.draft_max);
  workload.auto_chunk = false;
  LoadedModel lm = load_model(o.model, workload, mtp_load_for(o.sampling.spec));
  const size_t blanks = static_cast<size_t>(std::count_if(texts.begin(), texts.end(), blank));
  const size_t prompts = texts.size() - blanks;
  const int slots = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(lm.plan.sessions, int64_t(prompts))));
  fmt::print(stderr, "dsv4: {} prompts through {} slot{}{}\n", prompts, slots, slots == 1 ? "" : "s",
             blanks ? fmt::format(" ({} blank line{}: an error result each)", blanks, blanks == 1 ? "" : "s") : "");

  GenerationRequest defaults;
  defaults.sampling = sampling_params(lm.dir, o.sampling);
  defaults.max_tokens = o.sampling.max_tokens;
  defaults.stop_strings = o.sampling.stop;
  defaults.spec = parse_spec_mode(o.sampling.spec);
  defaults.draft_max = static_cast<int>(o.sampling.draft_max);
  defaults.stop_ids = {static_cast<int32_t>(lm.engine->config().eos_token_id)};
  defaults.context_limit = o.model.ctx;
  defaults.chunk = chunk;
  const int64_t limit = context_tokens(*lm.engine, o.model);

  std::vector<std::string> results(texts.size());
  std::vector<char> ready(texts.size(), 0);
  size_t written = 0;
  std::mutex mu;
  std::atomic<size_t> next{0};
  int64_t done = 0, tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  Progress progress("batch", "prompts", static_cast<int64_t>(texts.size()));
  bool write_failed = false;
  auto worker = [&] {
    Engine::BatchMember member = slots > 1 ? lm.engine->join_batch() : Engine::BatchMember();
    SessionState session = lm.engine->new_session();
    for (size_t i; (i = next++) < texts.size();) {
      Line line = parse_line(texts[i], i + 1, o.batch, lm, defaults, eo, limit, o.batch_line_mb);
      std::string().swap(texts[i].text);  // parsed: the line's text is no longer needed
      Json j = {{"id", line.id}};
      int64_t generated = 0;
      if (!line.error.empty()) {
        j["error"] = line.error;
      } else {
        try {
          text::IncrementalDecoder decoder(lm.tokenizer, std::move(line.show_special));
          GenerationCallbacks cb;
          cb.detokenize = [&](int32_t id) { return decoder.push(id); };
          cb.flush = [&] { return decoder.finish(); };
          const GenerationResult r = generate(*lm.engine, session, line.request, cb);
          generated = r.stats.generated_tokens;
          j["text"] = r.text;
          j["tokens"] = r.tokens;
          j["finish_reason"] = finish_reason_name(r.finish);
          j["stats"] = {{"prompt_tokens", r.stats.prompt_tokens}, {"generated_tokens", r.stats.generated_tokens},
                        {"ttft_s", r.stats.ttft_s}, {"decode_tok_s", r.stats.decode_tok_s()}};
        } catch (const std::exception& e) {
          j["error"] = e.what();
          session = lm.engine->new_session();
        }
      }
      std::lock_guard lock(mu);
      results[i] = j.dump(-1, ' ', false, Json::error_handler_t::replace);
      ready[i] = 1;
      // In input order, as soon as each line's predecessors are written.
      while (written < results.size() && ready[written]) {
        std::string& s = results[written];
        if (std::fprintf(out, "%s\n", s.c_str()) < 0) write_failed = true;
        std::string().swap(s);
        ++written;
      }
      std::fflush(out);
      ++done;
      tokens += generated;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double rate = secs > 0 ? double(tokens) / secs : 0;
      const double eta = done > 0 ? secs / double(done) * double(int64_t(texts.size()) - done) : 0;
      progress.update(done, fmt::format("{:.1f} tok/s, ETA {}", rate, eta_text(eta)));
    }
  };
  std::vector<std::thread> threads;
  for (int s = 0; s < slots; ++s) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  progress.finish();
  const bool closed = std::fclose(out) == 0;
  if (write_failed || !closed) fail("{}: write failed (--out)", o.batch_out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(stderr,
             "dsv4: {} prompts, {} tokens generated in {:.1f} s ({:.2f} tok/s) with {} slot{}, peak RSS {}; "
             "results in {}\n",
             prompts, tokens, secs, secs > 0 ? double(tokens) / secs : 0.0, slots, slots == 1 ? "" : "s",
             format_bytes(peak_rss_bytes()), o.batch_out);
  return 0;
}

}  // namespace dsv4::cli
