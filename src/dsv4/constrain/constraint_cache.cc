#include "dsv4/constrain/constraint_cache.h"

namespace dsv4::constrain {
namespace {

// Everything build_answer_grammar reads, as text.
std::string key_of(const AnswerFormat& f) {
  Json k = {{"thinking", f.thinking}, {"required", f.calls_required}, {"max_calls", f.max_calls}};
  if (f.content_schema) k["content"] = {*f.content_schema, f.content_where, f.content_strict};
  Json tools = Json::array();
  for (const ToolSchema& t : f.tools)
    tools.push_back({t.name, t.parameters ? *t.parameters : Json(nullptr), t.where, t.strict});
  k["tools"] = std::move(tools);
  return k.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

ConstraintCache::ConstraintCache(const text::Tokenizer& tokenizer, size_t capacity)
    : tokenizer_(tokenizer), capacity_(std::max<size_t>(capacity, 1)) {}

std::shared_ptr<const CompiledConstraint> ConstraintCache::get(const AnswerFormat& format,
                                                               std::vector<std::string>* dropped) {
  const std::string key = key_of(format);
  std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->key == key) {
      lru_.splice(lru_.begin(), lru_, it);
      if (dropped) *dropped = lru_.front().dropped;
      return lru_.front().constraint;
    }
  }
  std::vector<std::string> lost;
  Grammar g = build_answer_grammar(format, {}, &lost);
  if (!vocab_) vocab_ = std::make_shared<const TokenTrie>(tokenizer_);
  auto c = std::make_shared<const CompiledConstraint>(std::move(g), vocab_);
  if (dropped) *dropped = lost;
  lru_.push_front({key, c, std::move(lost)});
  if (lru_.size() > capacity_) lru_.pop_back();
  return c;
}

size_t ConstraintCache::entries() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

size_t ConstraintCache::memory_bytes() const {
  std::lock_guard lock(mu_);
  size_t bytes = vocab_ ? vocab_->memory_bytes() : 0;
  for (const Entry& e : lru_) bytes += e.key.size() + e.constraint->memory_bytes();
  return bytes;
}

}  // namespace dsv4::constrain
