#include "dsv4/runtime/chat_session.h"

#include "dsv4/runtime/session_mark.h"

namespace dsv4 {

namespace chat = text::chat;

ChatSession::ChatSession(Engine& engine, const text::Tokenizer& tokenizer)
    : engine_(engine),
      tokenizer_(tokenizer),
      eos_(static_cast<int32_t>(engine.config().eos_token_id)),
      session_(engine.new_session()),
      history_(chat::Json::array()) {}

void ChatSession::reset(std::string system) {
  system_ = std::move(system);
  session_ = engine_.new_session();
  history_ = chat::Json::array();
  unfed_.clear();
  turns_ = 0;
}

std::vector<int32_t> ChatSession::next_prompt(const std::string& user_text, chat::EncodeOptions eo) const {
  const chat::Json user = {{"role", "user"}, {"content", user_text}};
  if (history_.empty()) {
    chat::Json first = chat::Json::array();
    if (!system_.empty()) first.push_back({{"role", "system"}, {"content", system_}});
    first.push_back(user);
    eo.add_bos = true;
    const chat::Prompt p = chat::render_prompt(first, eo);
    return tokenizer_.encode(p.text, p.caller);
  }
  // Continue the token history the session holds: only the new turn is encoded.
  std::vector<int32_t> prompt = session_.tokens;
  prompt.insert(prompt.end(), unfed_.begin(), unfed_.end());
  eo.add_bos = false;
  const chat::Prompt p = chat::render_prompt(chat::Json::array({user}), eo, history_);
  const std::vector<int32_t> turn = tokenizer_.encode(p.text, p.caller);
  prompt.insert(prompt.end(), turn.begin(), turn.end());
  return prompt;
}

ChatSession::Turn ChatSession::turn(const std::string& user_text, const chat::EncodeOptions& eo, GenerationRequest req,
                                    const GenerationCallbacks& cb) {
  Turn t;
  t.prompt = next_prompt(user_text, eo);
  req.prompt = t.prompt;
  const SessionMark before = mark_session(session_);
  try {
    t.result = generate(engine_, session_, req, cb);
  } catch (...) {
    rewind_session(session_, before);
    throw;
  }
  if (t.result.finish == FinishReason::kCancelled) {
    rewind_session(session_, before);
    return t;
  }
  // Close the assistant turn in the token history: its last token was never fed, and a turn
  // cut short by the token limit still needs its end-of-sentence.
  const GenerationResult& r = t.result;
  unfed_.assign(r.tokens.empty() ? 0 : 1, r.tokens.empty() ? 0 : r.tokens.back());
  if (r.tokens.empty() || r.tokens.back() != eos_) unfed_.push_back(eos_);
  if (history_.empty() && !system_.empty()) history_.push_back({{"role", "system"}, {"content", system_}});
  history_.push_back({{"role", "user"}, {"content", user_text}});
  history_.push_back({{"role", "assistant"}, {"content", r.text}});
  ++turns_;
  t.kept = true;
  return t;
}

}  // namespace dsv4
