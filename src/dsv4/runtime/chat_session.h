// A multi-turn conversation over one session, as `dsv4 chat` runs it. Each turn encodes only
// the new user message after the token history the session holds, so it prefills only that.
// A turn that is cancelled (Ctrl-C, during the prefill or the answer) or fails leaves the
// conversation exactly as it was before the turn: the session is rewound to a mark taken at
// the turn's start, and the history and unfed tokens are untouched, so the next turn's prompt
// is token for token the one it would have been had the cancelled turn never been typed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/model/engine.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4 {

class ChatSession {
 public:
  // The engine and tokenizer must outlive the session.
  ChatSession(Engine& engine, const text::Tokenizer& tokenizer);

  // Forgets the conversation; `system` (may be empty) is the next first turn's system prompt.
  void reset(std::string system = "");

  // The prompt the next turn with this user message would have. `eo.add_bos` is decided here
  // (the first turn has the BOS token).
  std::vector<int32_t> next_prompt(const std::string& user_text, text::chat::EncodeOptions eo) const;

  struct Turn {
    std::vector<int32_t> prompt;
    GenerationResult result;
    bool kept = false;  // false: cancelled; the conversation is as it was before the turn
  };
  // Runs one turn: req's sampling, limits and stops are used, its prompt is set here. A
  // generate() error leaves the conversation unchanged and is rethrown.
  Turn turn(const std::string& user_text, const text::chat::EncodeOptions& eo, GenerationRequest req,
            const GenerationCallbacks& cb);

  const SessionState& session() const { return session_; }
  int turns() const { return turns_; }

 private:
  Engine& engine_;
  const text::Tokenizer& tokenizer_;
  int32_t eos_;
  std::string system_;
  SessionState session_;
  text::chat::Json history_;   // the messages already in the session
  std::vector<int32_t> unfed_;  // tokens the history implies but the session has not been fed
  int turns_ = 0;
};

}  // namespace dsv4
