// What the constrained-decoding tests share: a schema's answer grammar and whether a text is a
// complete output of a grammar.
#pragma once

#include <string_view>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/grammar.h"
#include "dsv4/constrain/json_schema.h"

namespace dsv4::constrain {

// The answer grammar of a response_format schema (content only; `thinking`: a reasoning block first).
inline Grammar content_grammar(const Json& schema, bool thinking = false) {
  AnswerFormat f;
  f.content_schema = &schema;
  f.content_where = "schema";
  f.thinking = thinking;
  return build_answer_grammar(f);
}

inline Grammar content_grammar(const char* schema, bool thinking = false) {
  return content_grammar(Json::parse(schema), thinking);
}

// Whether `text` (bytes; specials as their symbols) is a complete output of `g`.
inline bool accepts(const Grammar& g, std::string_view text) {
  StackSet set = initial_stacks(g);
  for (Symbol s : g.symbols(text)) {
    set = advance(g, set, s);
    if (set.empty()) return false;
  }
  return can_end(g, set);
}

}  // namespace dsv4::constrain
