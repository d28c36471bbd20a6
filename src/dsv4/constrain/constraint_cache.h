// Compiled constraints kept per answer format, for a server that sees the same schema again
// and again: compiling is cheap, but the state tables and masks a constraint builds while it
// runs (matcher.h) are what makes later requests fast. Least recently used entries go first.
// The vocabulary trie is built once, on first use. Thread-safe.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/matcher.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::constrain {

class ConstraintCache {
 public:
  explicit ConstraintCache(const text::Tokenizer& tokenizer, size_t capacity = 4);

  // The constraint for `format`, compiled now or found. Throws SchemaError / Error as
  // build_answer_grammar and CompiledConstraint do; `dropped` (if given) receives what
  // build_answer_grammar dropped from schemas that are not strict.
  std::shared_ptr<const CompiledConstraint> get(const AnswerFormat& format, std::vector<std::string>* dropped = nullptr);

  size_t entries() const;
  size_t memory_bytes() const;  // entries' caches plus the vocabulary trie

 private:
  const text::Tokenizer& tokenizer_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::shared_ptr<const TokenTrie> vocab_;
  struct Entry {
    std::string key;
    std::shared_ptr<const CompiledConstraint> constraint;
    std::vector<std::string> dropped;
  };
  std::list<Entry> lru_;  // most recent first
};

}  // namespace dsv4::constrain
