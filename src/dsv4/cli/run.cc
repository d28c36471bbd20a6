// dsv4 run (one prompt, streamed) and dsv4 chat (multi-turn REPL that keeps the session
// between turns, so each turn prefills only its new tokens).
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/cli/common.h"
#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/matcher.h"
#include "dsv4/platform/platform.h"
#include "dsv4/runtime/chat_session.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/progress.h"

namespace dsv4::cli {
namespace {

namespace chat = text::chat;

// Ctrl-C: the first press cancels the running answer, a second one exits. A signal handler
// can only talk to the program through lock-free atomics, hence these two globals.
std::atomic<bool> g_cancel{false};
std::atomic<int> g_interrupts{0};

void on_interrupt() {
  g_cancel.store(true);
  if (g_interrupts.fetch_add(1) >= 1) platform::exit_now(130);
}

void install_sigint() { platform::on_interrupt(on_interrupt); }

chat::EncodeOptions encode_options(const ChatStyle& style, bool add_bos) {
  chat::EncodeOptions e;
  e.thinking_mode = style.think ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  if (style.effort == "high") e.reasoning_effort = chat::ReasoningEffort::kHigh;
  else if (style.effort == "max") e.reasoning_effort = chat::ReasoningEffort::kMax;
  else if (!style.effort.empty()) fail("--effort must be \"high\" or \"max\", got \"{}\"", style.effort);
  e.add_bos = add_bos;
  // Keep earlier reasoning in the prompt: the session already holds it, so the next turn
  // reuses every token instead of re-prefilling a rewritten history.
  e.drop_thinking = false;
  return e;
}

GenerationRequest make_request(const LoadedModel& lm, const ModelOptions& m, const SamplingOptions& s) {
  GenerationRequest r;
  r.sampling = sampling_params(lm.dir, s);
  r.max_tokens = s.max_tokens;
  r.stop_strings = s.stop;
  r.spec = parse_spec_mode(s.spec);
  r.draft_max = static_cast<int>(s.draft_max);
  r.stop_ids = {static_cast<int32_t>(lm.engine->config().eos_token_id)};
  r.context_limit = m.ctx;
  r.chunk = m.chunk;
  return r;
}

void announce_demo(const LoadedModel& lm) {
  if (lm.demo)
    fmt::print(stderr, "dsv4: no -m given: using the built-in demo model in {} (a tiny DeepSeek V4 trained on the King James Bible)\n",
               lm.dir);
}

// Streams a generation's text to stdout (unless quiet), shows the prefill's progress, and
// arms Ctrl-C to cancel it.
class TerminalStream {
 public:
  TerminalStream(const text::Tokenizer& tokenizer, bool quiet, text::IncrementalDecoder::ShowSpecial show_special)
      : decoder_(tokenizer, std::move(show_special)) {
    cb_.detokenize = [this](int32_t id) { return decoder_.push(id); };
    cb_.flush = [this] { return decoder_.finish(); };
    cb_.on_text = [this, quiet](const std::string& t) {
      if (progress_) progress_->finish();
      if (quiet || t.empty()) return;
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
      ends_with_newline_ = t.back() == '\n';
    };
    cb_.on_prefill_progress = [this](int64_t done, int64_t total) {
      if (!progress_) progress_.emplace("prefill", "tokens", total, 256);
      progress_->update(done);
    };
    g_cancel.store(false);
    g_interrupts.store(0);
    cb_.cancel = &g_cancel;
  }
  ~TerminalStream() {
    if (progress_) progress_->finish();
  }
  const GenerationCallbacks& callbacks() const { return cb_; }
  bool ends_with_newline() const { return ends_with_newline_; }

 private:
  text::IncrementalDecoder decoder_;
  std::optional<Progress> progress_;
  GenerationCallbacks cb_;
  bool ends_with_newline_ = true;
};

// One chat turn, streamed; a cancelled turn leaves `conversation` as it was.
ChatSession::Turn stream_turn(LoadedModel& lm, ChatSession& conversation, const std::string& text,
                              const chat::EncodeOptions& eo, const GenerationRequest& req) {
  TerminalStream out(lm.tokenizer, false, chat::answer_specials(lm.tokenizer, eo.thinking_mode, false));
  ChatSession::Turn t = conversation.turn(text, eo, req, out.callbacks());
  if (!out.ends_with_newline()) std::fputc('\n', stdout);
  return t;
}

// 15009 -> "15,009".
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// "cancelled after 4,096 of 15,009 prompt tokens" / "cancelled after 12 tokens of the answer".
std::string cancelled_text(const GenerationStats& s) {
  const int64_t to_prefill = s.prompt_tokens - s.reused_tokens;
  if (s.generated_tokens == 0 && s.prefilled_tokens < to_prefill)
    return fmt::format("cancelled after {} of {} prompt tokens", grouped(s.prefilled_tokens), grouped(to_prefill));
  return fmt::format("cancelled after {} {} of the answer", grouped(s.generated_tokens),
                     s.generated_tokens == 1 ? "token" : "tokens");
}

void report_finish(const GenerationResult& r, int64_t context_limit) {
  if (r.finish == FinishReason::kContextLimit)
    fmt::print(stderr, "dsv4: stopped: the context limit of {} tokens is reached\n", context_limit);
  if (r.finish == FinishReason::kCancelled) fmt::print(stderr, "dsv4: {}\n", cancelled_text(r.stats));
}

nlohmann::json stats_json(const GenerationStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},   {"reused_tokens", s.reused_tokens},
          {"generated_tokens", s.generated_tokens}, {"ttft_s", s.ttft_s},
          {"prefill_s", s.prefill_s},           {"decode_s", s.decode_s},
          {"prefill_tok_s", s.prefill_tok_s()}, {"decode_tok_s", s.decode_tok_s()},
          {"expert_requests", s.expert_requests}, {"expert_hit_rate", s.hit_rate()},
          {"bytes_read", s.bytes_read},         {"peak_rss_bytes", s.peak_rss_bytes},
          {"seed", s.seed},                     {"constraint_s", s.constraint_s},
          {"decode_passes", s.decode_passes},   {"drafted_tokens", s.drafted_tokens},
          {"accepted_tokens", s.accepted_tokens}, {"acceptance", s.acceptance()},
          {"tokens_per_pass", s.tokens_per_pass()}, {"accepted_at", s.accepted_at},
          {"drafted_at", s.drafted_at}};
}

// --json-schema: the schema file, checked before the model loads (a bad schema fails fast).
struct SchemaConstraint {
  chat::Json schema;
  std::optional<constrain::Grammar> grammar;
};

SchemaConstraint load_schema_constraint(const std::string& path, bool thinking, bool strict) {
  SchemaConstraint c;
  const std::string text = read_small_file(path, 16u << 20);
  c.schema = chat::Json::parse(text, nullptr, false);
  if (c.schema.is_discarded()) fail("{}: not valid JSON (--json-schema)", path);
  constrain::AnswerFormat f;
  f.thinking = thinking;
  f.content_schema = &c.schema;
  f.content_strict = strict;
  std::vector<std::string> dropped;
  try {
    c.grammar = constrain::build_answer_grammar(f, {}, &dropped);
  } catch (const constrain::SchemaError& e) {
    fail("{}: {}", path, e.what());
  }
  for (const std::string& d : dropped)
    std::fprintf(stderr, "warning: %s: dropped unsupported keyword at %s (not enforced)\n", path.c_str(), d.c_str());
  return c;
}

}  // namespace

int run_batch(const RunOptions& o, const chat::EncodeOptions& eo);  // run_batch.cc

int run(const RunOptions& o) {
  if (o.special_tokens && !o.raw) fail("--special-tokens needs --raw (a chat prompt's text is always plain text)");
  if (!o.batch.empty()) {
    if (!o.prompt.empty()) fail("--batch takes its prompts from the file; give no prompt argument");
    if (!o.json_schema.empty()) fail("--json-schema cannot be combined with --batch");
    return run_batch(o, encode_options(o.style, true));
  }
  std::string prompt_text;
  for (const std::string& part : o.prompt) prompt_text += (prompt_text.empty() ? "" : " ") + part;
  if (o.prompt.empty()) {
    if (platform::is_terminal(0)) fail("no prompt: give it as an argument (dsv4 run \"...\") or on stdin");
    prompt_text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  if (prompt_text.empty()) fail("the prompt is empty");
  std::optional<SchemaConstraint> schema;
  if (!o.json_schema.empty()) {
    if (!o.sampling.stop.empty()) fail("--stop cannot be combined with --json-schema (a stop string could cut the value)");
    schema = load_schema_constraint(o.json_schema, o.style.think && !o.raw, o.schema_strict);
  }
  LoadedModel lm = load_model(o.model, interactive_workload(o.model), mtp_load_for(o.sampling.spec));
  announce_demo(lm);
  install_sigint();

  GenerationRequest req = make_request(lm, o.model, o.sampling);
  const int64_t limit = context_tokens(*lm.engine, o.model);
  const chat::EncodeOptions eo = encode_options(o.style, true);
  text::IncrementalDecoder::ShowSpecial show_special;  // null: all (--raw --special-tokens)
  if (o.raw) {
    // Plain continuation: BOS, then the text as is (its special-token text only with --special-tokens).
    const text::TextRange all{0, prompt_text.size()};
    const auto plain = o.special_tokens ? std::span<const text::TextRange>() : std::span(&all, 1);
    req.prompt = {static_cast<int32_t>(lm.engine->config().bos_token_id)};
    const std::vector<int32_t> ids = encode_prompt(lm.tokenizer, prompt_text, plain, limit - 1, "the prompt");
    req.prompt.insert(req.prompt.end(), ids.begin(), ids.end());
    if (!o.special_tokens) show_special = [](int32_t) { return false; };
  } else {
    chat::Json messages = chat::Json::array();
    if (!o.style.system.empty()) messages.push_back({{"role", "system"}, {"content", o.style.system}});
    messages.push_back({{"role", "user"}, {"content", prompt_text}});
    // The model is told the schema the way its chat format says (a "Response Format" section).
    if (schema) messages = chat::attach_response_format(messages, schema->schema);
    const chat::Prompt p = chat::render_prompt(messages, eo);
    req.prompt = encode_prompt(lm.tokenizer, p.text, p.caller, limit, "the prompt");
    show_special = chat::answer_specials(lm.tokenizer, eo.thinking_mode, false);
  }
  if (schema) {
    req.constraint = std::make_shared<const constrain::CompiledConstraint>(
        std::move(*schema->grammar), std::make_shared<const constrain::TokenTrie>(lm.tokenizer));
    if (const int64_t need = req.constraint->min_tokens(); req.max_tokens < need)
      fail("--max-tokens {} is too small for {}: its shortest complete answer takes {} tokens", req.max_tokens,
           o.json_schema, need);
  }
  SessionState session = lm.engine->new_session();
  GenerationResult r;
  bool ends_with_newline = true;
  {
    TerminalStream out(lm.tokenizer, o.json, std::move(show_special));
    r = generate(*lm.engine, session, req, out.callbacks());
    ends_with_newline = out.ends_with_newline();
  }
  if (o.json) {
    nlohmann::json j = {{"text", r.text}, {"prompt_tokens", req.prompt}, {"tokens", r.tokens},
                        {"finish_reason", finish_reason_name(r.finish)}, {"stats", stats_json(r.stats)}};
    std::puts(j.dump().c_str());
  } else if (!ends_with_newline) {
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);
  report_finish(r, lm.engine->context_limit());
  if (schema && r.finish != FinishReason::kStop)
    fmt::print(stderr, "dsv4: the output is not a complete JSON value (it was cut short)\n");
  fmt::print(stderr, "{}\n", stats_line(r.stats));
  return r.finish == FinishReason::kCancelled ? 130 : 0;
}

namespace {

// Reads one line from stdin unbuffered so Ctrl-C interrupts it. false on EOF or interrupt.
bool read_line(std::string* line, bool* interrupted) {
  line->clear();
  *interrupted = false;
  char ch;
  for (;;) {
    const int64_t n = platform::read_stdin(&ch, 1);
    if (n < 0 && errno == EINTR) {
      *interrupted = true;
      return false;
    }
    if (n <= 0) return !line->empty();
    if (ch == '\n') return true;
    *line += ch;
  }
}

constexpr const char* kChatHelp =
    "commands: /reset (forget the conversation), /system TEXT (set the system prompt and reset), /think (toggle "
    "thinking mode), /stats (totals so far), /exit\n";

}  // namespace

int chat(const ChatOptions& o) {
  LoadedModel lm = load_model(o.model, interactive_workload(o.model), mtp_load_for(o.sampling.spec));
  announce_demo(lm);
  install_sigint();
  const bool tty = platform::is_terminal(0) && platform::is_terminal(1);
  ChatStyle style = o.style;
  const int64_t limit = lm.engine->context_limit();

  ChatSession conversation(*lm.engine, lm.tokenizer);
  conversation.reset(style.system);
  GenerationStats total;
  if (tty) fmt::print(stderr, "dsv4 chat: {} ({}). {}", lm.dir, style.think ? "thinking" : "chat mode", kChatHelp);

  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    bool interrupted;
    g_interrupts.store(0);
    if (!read_line(&line, &interrupted)) {
      if (tty) std::fputc('\n', stdout);
      break;
    }
    if (line.empty()) continue;
    if (line[0] == '/') {
      const std::string cmd = line.substr(0, line.find(' '));
      const std::string arg = line.find(' ') == std::string::npos ? "" : line.substr(line.find(' ') + 1);
      if (cmd == "/exit" || cmd == "/quit") break;
      if (cmd == "/reset" || cmd == "/system") {
        if (cmd == "/system") style.system = arg;
        conversation.reset(style.system);
        fmt::print(stderr, "[conversation reset{}]\n", cmd == "/system" ? ", system prompt set" : "");
      } else if (cmd == "/think") {
        style.think = !style.think;
        fmt::print(stderr, "[thinking mode {}]\n", style.think ? "on" : "off");
      } else if (cmd == "/stats") {
        fmt::print(stderr, "[{} turns, session at {} tokens] {}\n", conversation.turns(), conversation.session().position,
                   stats_line(total));
      } else if (cmd == "/help") {
        fmt::print(stderr, "{}", kChatHelp);
      } else {
        fmt::print(stderr, "unknown command {}. {}", cmd, kChatHelp);
      }
      continue;
    }

    ChatSession::Turn t;
    try {
      t = stream_turn(lm, conversation, line, encode_options(style, false), make_request(lm, o.model, o.sampling));
    } catch (const Error& e) {
      // A turn that cannot run (e.g. the context is full) leaves the conversation as it was.
      fmt::print(stderr, "dsv4: error: {}\n", e.what());
      continue;
    }
    const GenerationResult& r = t.result;
    std::fflush(stdout);
    if (t.kept) {
      total.prompt_tokens += r.stats.prompt_tokens;
      total.reused_tokens += r.stats.reused_tokens;
      total.prefilled_tokens += r.stats.prefilled_tokens;
      total.generated_tokens += r.stats.generated_tokens;
      total.prefill_s += r.stats.prefill_s;
      total.decode_s += r.stats.decode_s;
      total.expert_requests += r.stats.expert_requests;
      total.expert_hits += r.stats.expert_hits;
      total.bytes_read += r.stats.bytes_read;
      total.peak_rss_bytes = r.stats.peak_rss_bytes;
      report_finish(r, limit);
    } else {
      fmt::print(stderr, "dsv4: {}; the conversation is as it was before this turn\n", cancelled_text(r.stats));
    }
    fmt::print(stderr, "{}\n", stats_line(r.stats));
  }
  return 0;
}

}  // namespace dsv4::cli
