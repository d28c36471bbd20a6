#include "dsv4/constrain/matcher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "dsv4/util/error.h"

namespace dsv4::constrain {
namespace {

constexpr int32_t kUnknown = -2;
constexpr int32_t kDead = -1;
constexpr uint64_t kUnknownNeed = std::numeric_limits<uint64_t>::max();
// A single mask walk may intern more states than kMaxStates before it ends; past this it
// starts the tables over in the middle of the walk (keeping the states on its path).
constexpr size_t kHardMaxStates = 4 * kMaxStates;

using Clock = std::chrono::steady_clock;

}  // namespace

struct CompiledConstraint::Table {
  Table(const Grammar& grammar, const TokenTrie& v)
      : g(grammar), vocab(v), nsym(kFirstSpecial + grammar.specials().size()),
        words((static_cast<size_t>(v.vocab_size()) + 63) / 64) {}

  const Grammar& g;
  const TokenTrie& vocab;
  const size_t nsym;
  const size_t words;
  uint64_t epoch = 0;  // bumped whenever ids are reassigned

  std::unordered_map<std::string, uint32_t> index;
  std::vector<const std::string*> keys;
  std::vector<int32_t> trans;  // keys.size() * nsym
  std::vector<int8_t> ends, completes;  // per state: -1 unknown
  std::vector<uint64_t> needs;          // per state: tokens_to_finish (kUnknownNeed: not yet)

  std::unordered_map<uint32_t, uint32_t> mask_slot;
  std::vector<uint64_t> masks;       // slots * words
  std::vector<uint32_t> slot_state;  // which state a slot holds
  std::vector<uint64_t> slot_need;   // the most tokens to finish any token of the slot's mask leaves
  std::vector<uint8_t> slot_used;    // second-chance bit
  size_t hand = 0;

  std::vector<uint32_t> scratch;

  size_t size() const { return keys.size(); }

  uint32_t intern_encoded(std::string key) {
    auto [it, inserted] = index.try_emplace(std::move(key), static_cast<uint32_t>(keys.size()));
    if (inserted) {
      keys.push_back(&it->first);
      trans.resize(trans.size() + nsym, kUnknown);
      ends.push_back(-1);
      completes.push_back(-1);
      needs.push_back(kUnknownNeed);
    }
    return it->second;
  }

  uint32_t intern(const StackSet& set) {
    encode_stacks(set, scratch);
    return intern_encoded(std::string(reinterpret_cast<const char*>(scratch.data()), scratch.size() * 4));
  }

  StackSet decode(uint32_t id) const {
    const std::string& k = *keys[id];
    std::vector<uint32_t> v(k.size() / 4);
    std::memcpy(v.data(), k.data(), k.size());
    return decode_stacks(v);
  }

  int32_t step(uint32_t id, Symbol s) {
    int32_t& slot = trans[id * nsym + s];
    if (slot != kUnknown) return slot;
    const StackSet next = advance(g, decode(id), s);
    const int32_t to = next.empty() ? kDead : static_cast<int32_t>(intern(next));
    trans[id * nsym + s] = to;  // `slot` may dangle: intern() can grow the table
    return to;
  }

  bool can_end(uint32_t id) {
    if (ends[id] < 0) ends[id] = constrain::can_end(g, decode(id)) ? 1 : 0;
    return ends[id] != 0;
  }

  // Tokens a complete output still needs from state `id`.
  uint64_t need(uint32_t id) {
    if (needs[id] == kUnknownNeed) needs[id] = tokens_to_finish(g, decode(id));
    return needs[id];
  }

  // Nothing at all may follow: the output is finished.
  bool complete(uint32_t id) {
    if (completes[id] < 0) {
      bool any = false;
      if (can_end(id)) {
        for (size_t s = 0; s < nsym && !any; ++s) any = step(id, static_cast<Symbol>(s)) >= 0;
      }
      completes[id] = can_end(id) && !any ? 1 : 0;
    }
    return completes[id] != 0;
  }

  void clear() {
    index.clear();
    keys.clear();
    trans.clear();
    ends.clear();
    completes.clear();
    needs.clear();
    mask_slot.clear();
    masks.clear();
    slot_state.clear();
    slot_need.clear();
    slot_used.clear();
    hand = 0;
    ++epoch;
  }

  // Starts the tables over, keeping the states in `path` (their ids are rewritten).
  void restart(std::span<int32_t> path) {
    std::vector<std::string> kept;
    for (int32_t id : path) kept.push_back(*keys[static_cast<size_t>(id)]);
    clear();
    for (size_t i = 0; i < path.size(); ++i) path[i] = static_cast<int32_t>(intern_encoded(std::move(kept[i])));
  }

  // One walk over the vocabulary trie from state `id`, following (and filling) the table and
  // skipping every subtree whose prefix is refused: `take(token, state after it)` for each
  // token the grammar allows, special tokens included (end tokens are not). `id` may change if
  // the tables start over during the walk.
  template <class Take>
  void walk(uint32_t& id, std::span<const int32_t> special_ids, Take&& take) {
    const auto& nodes = vocab.nodes();
    std::vector<int32_t> path(vocab.max_depth() + 1);
    path[0] = static_cast<int32_t>(id);
    const size_t n = nodes.size();
    size_t i = 0;
    while (i < n) {
      const TokenTrie::Node& nd = nodes[i];
      int32_t parent = path[nd.depth - 1];
      int32_t to = trans[static_cast<size_t>(parent) * nsym + nd.byte];
      if (to == kUnknown) {
        if (size() >= kHardMaxStates) {
          restart(std::span<int32_t>(path).first(nd.depth));
          parent = path[nd.depth - 1];
        }
        to = step(static_cast<uint32_t>(parent), nd.byte);
      }
      if (to < 0) {
        i = nd.skip;
        continue;
      }
      path[nd.depth] = to;
      if (nd.token >= 0) take(nd.token, static_cast<uint32_t>(to));
      ++i;
    }
    id = static_cast<uint32_t>(path[0]);
    for (size_t k = 0; k < special_ids.size(); ++k) {
      const int32_t to = step(id, static_cast<Symbol>(kFirstSpecial + k));
      if (to >= 0) take(special_ids[k], static_cast<uint32_t>(to));
    }
  }

  static void set_bit(std::vector<uint64_t>& bits, int32_t token) {
    bits[static_cast<size_t>(token) >> 6] |= uint64_t{1} << (token & 63);
  }

  // The tokens that may follow state `id` (bits over the tokenizer's ids; end tokens not
  // included), and in `max_need` the most tokens to finish that any of them leaves. `id` may
  // change if the tables start over during the walk.
  const uint64_t* mask(uint32_t& id, std::span<const int32_t> special_ids, uint64_t* max_need) {
    if (auto it = mask_slot.find(id); it != mask_slot.end()) {
      slot_used[it->second] = 1;
      *max_need = slot_need[it->second];
      return &masks[it->second * words];
    }
    std::vector<uint64_t> bits(words, 0);
    uint64_t most = 0;
    walk(id, special_ids, [&](int32_t token, uint32_t to) {
      set_bit(bits, token);
      most = std::max(most, need(to));
    });
    *max_need = most;
    return store_mask(id, bits, most);
  }

  // The tokens that may follow state `id` and leave at most `limit` tokens to finish (not
  // cached: budgets are tight only for the last few tokens). `least`: the fewest any allowed
  // token leaves. Returns whether any token passed.
  bool budget_mask(uint32_t& id, std::span<const int32_t> special_ids, uint64_t limit, std::vector<uint64_t>& bits,
                   uint64_t& least) {
    bits.assign(words, 0);
    least = kNever;
    bool any = false;
    walk(id, special_ids, [&](int32_t token, uint32_t to) {
      const uint64_t left = need(to);
      least = std::min(least, left);
      if (left <= limit) {
        set_bit(bits, token);
        any = true;
      }
    });
    return any;
  }

  const uint64_t* store_mask(uint32_t id, const std::vector<uint64_t>& bits, uint64_t max_need) {
    uint32_t slot;
    if (slot_state.size() < kMaxMasks) {
      slot = static_cast<uint32_t>(slot_state.size());
      slot_state.push_back(id);
      slot_need.push_back(max_need);
      slot_used.push_back(1);
      masks.resize(masks.size() + words);
    } else {
      while (slot_used[hand]) {
        slot_used[hand] = 0;
        hand = (hand + 1) % kMaxMasks;
      }
      slot = static_cast<uint32_t>(hand);
      hand = (hand + 1) % kMaxMasks;
      mask_slot.erase(slot_state[slot]);
      slot_state[slot] = id;
      slot_need[slot] = max_need;
      slot_used[slot] = 1;
    }
    mask_slot[id] = slot;
    std::memcpy(&masks[slot * words], bits.data(), words * sizeof(uint64_t));
    return &masks[slot * words];
  }

  size_t memory_bytes() const {
    size_t bytes = trans.capacity() * sizeof(int32_t) + masks.capacity() * sizeof(uint64_t) + ends.capacity() * 2;
    for (const std::string* k : keys) bytes += k->capacity() + 64;
    return bytes;
  }
};

class CompiledConstraint::Run final : public ConstrainedRun {
 public:
  Run(const CompiledConstraint& c, std::span<const int32_t> end_tokens)
      : c_(c), ends_(end_tokens.begin(), end_tokens.end()) {
    std::lock_guard lock(c_.mu_);
    Table& t = *c_.table_;
    id_ = t.intern(initial_stacks(c_.grammar_));
    may_end_ = t.can_end(id_);
    remember(t);
  }

  // The allowed tokens' bits for `tokens_left` (see LogitConstraint): the cached mask, or
  // where the budget is tight the tokens that leave enough of it (if none does, those that
  // leave the most, so the output still gets as close to complete as it can).
  const uint64_t* bits(Table& t, int64_t tokens_left) {
    uint64_t max_need = 0;
    const uint64_t* cached = t.mask(id_, c_.special_ids_, &max_need);
    const uint64_t limit = tokens_left > 0 ? static_cast<uint64_t>(tokens_left - 1) : 0;
    if (tokens_left == kNoBudget || max_need <= limit) return cached;
    uint64_t least = 0;
    if (!t.budget_mask(id_, c_.special_ids_, limit, budget_bits_, least) && !t.can_end(id_))
      t.budget_mask(id_, c_.special_ids_, least, budget_bits_, least);
    return budget_bits_.data();
  }

  void mask(std::span<float> logits, int64_t tokens_left) override {
    const auto start = Clock::now();
    std::lock_guard lock(c_.mu_);
    Table& t = *c_.table_;
    if (t.size() > kMaxStates) t.clear();
    sync(t);
    const uint64_t* bits = this->bits(t, tokens_left);
    remember(t);
    const bool may_end = t.can_end(id_);
    const size_t have = std::min(logits.size(), static_cast<size_t>(c_.vocab_->vocab_size()));
    std::vector<float> kept;
    if (may_end)
      for (int32_t e : ends_) kept.push_back(e >= 0 && static_cast<size_t>(e) < logits.size() ? logits[e] : 0.0f);
    constexpr float kOff = -std::numeric_limits<float>::infinity();
    float* l = logits.data();
    const size_t full = have / 64;
    for (size_t w = 0; w < full; ++w) {
      const uint64_t word = bits[w];
      if (word == ~uint64_t{0}) continue;
      float* p = l + w * 64;
      if (word == 0) {  // most words of a narrow mask: a plain fill
        std::fill_n(p, 64, kOff);
        continue;
      }
      // A select, not a branch: allowed bits are scattered (tokens that start mid-character...).
      for (int b = 0; b < 64; ++b) p[b] = ((word >> b) & 1) ? p[b] : kOff;
    }
    for (size_t i = full * 64; i < have; ++i)
      if (!((bits[i >> 6] >> (i & 63)) & 1)) l[i] = kOff;
    for (size_t i = have; i < logits.size(); ++i) l[i] = kOff;
    if (may_end)
      for (size_t k = 0; k < ends_.size(); ++k)
        if (ends_[k] >= 0 && static_cast<size_t>(ends_[k]) < logits.size()) l[ends_[k]] = kept[k];
    seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  }

  void advance(int32_t token) override {
    const auto start = Clock::now();
    std::lock_guard lock(c_.mu_);
    Table& t = *c_.table_;
    sync(t);
    if (std::find(ends_.begin(), ends_.end(), token) != ends_.end()) {
      if (!t.can_end(id_)) fail("constrained decoding: token {} ends the output too early", token);
      ended_ = true;
    } else if (c_.vocab_->is_ordinary(token)) {
      uint32_t id = id_;
      for (uint8_t b : c_.vocab_->token_bytes(token)) {
        const int32_t to = t.step(id, b);
        if (to < 0) fail("constrained decoding: token {} is not allowed here", token);
        id = static_cast<uint32_t>(to);
      }
      id_ = id;
    } else {
      int32_t to = kDead;
      for (size_t k = 0; k < c_.special_ids_.size(); ++k)
        if (c_.special_ids_[k] == token) to = t.step(id_, static_cast<Symbol>(kFirstSpecial + k));
      if (to < 0) fail("constrained decoding: token {} is not allowed here", token);
      id_ = static_cast<uint32_t>(to);
    }
    complete_ = ended_ || t.complete(id_);
    may_end_ = ended_ || t.can_end(id_);
    remember(t);
    seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  }

  bool complete() const override { return complete_; }
  bool may_end() const override { return may_end_; }

  uint64_t need() {
    std::lock_guard lock(c_.mu_);
    Table& t = *c_.table_;
    sync(t);
    const uint64_t n = t.need(id_);
    remember(t);
    return n;
  }
  double seconds() const override { return seconds_; }

  // For tests.
  std::vector<bool> allowed(int64_t tokens_left) {
    std::lock_guard lock(c_.mu_);
    Table& t = *c_.table_;
    sync(t);
    const uint64_t* bits = this->bits(t, tokens_left);
    remember(t);
    std::vector<bool> out(static_cast<size_t>(c_.vocab_->vocab_size()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = (bits[i >> 6] >> (i & 63)) & 1;
    if (t.can_end(id_))
      for (int32_t e : ends_)
        if (e >= 0 && static_cast<size_t>(e) < out.size()) out[static_cast<size_t>(e)] = true;
    return out;
  }

 private:
  // The tables may have started over since this run last looked: find its state again.
  void sync(Table& t) {
    if (t.epoch != epoch_) id_ = t.intern_encoded(key_);
  }
  void remember(const Table& t) {
    epoch_ = t.epoch;
    key_ = *t.keys[id_];
  }

  const CompiledConstraint& c_;
  std::vector<int32_t> ends_;
  uint32_t id_ = 0;
  uint64_t epoch_ = 0;
  std::string key_;
  bool complete_ = false, ended_ = false, may_end_ = false;
  std::vector<uint64_t> budget_bits_;
  double seconds_ = 0;
};

CompiledConstraint::CompiledConstraint(Grammar grammar, std::shared_ptr<const TokenTrie> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  if (grammar_.root() == kNoNode) fail("constrain: the grammar is not finalized");
  for (const std::string& text : grammar_.specials()) {
    auto id = vocab_->added_token(text);
    if (!id) fail("the tokenizer has no {} token, which this output format needs", text);
    special_ids_.push_back(*id);
  }
  // Every byte must be spellable on its own, or the automaton could need a byte no token has.
  std::vector<bool> single(256, false);
  for (const TokenTrie::Node& n : vocab_->nodes())
    if (n.depth == 1 && n.token >= 0) single[n.byte] = true;
  for (int b = 0; b < 256; ++b)
    if (!single[static_cast<size_t>(b)])
      fail("the tokenizer has no token for the single byte 0x{:02X}; constrained decoding needs all 256", b);
  table_ = std::make_unique<Table>(grammar_, *vocab_);
}

CompiledConstraint::~CompiledConstraint() = default;

std::unique_ptr<ConstrainedRun> CompiledConstraint::begin(std::span<const int32_t> end_tokens) const {
  return std::make_unique<Run>(*this, end_tokens);
}

size_t CompiledConstraint::memory_bytes() const {
  std::lock_guard lock(mu_);
  return grammar_.memory_bytes() + table_->memory_bytes();
}

std::vector<bool> CompiledConstraint::allowed_after(std::span<const int32_t> tokens, std::span<const int32_t> end_tokens,
                                                    int64_t tokens_left) const {
  Run run(*this, end_tokens);
  for (int32_t t : tokens) run.advance(t);
  return run.allowed(tokens_left);
}

int64_t CompiledConstraint::min_tokens() const {
  return static_cast<int64_t>(std::min<uint64_t>(grammar_.min_output_tokens(), kNever));
}

uint64_t CompiledConstraint::tokens_to_finish_after(std::span<const int32_t> tokens) const {
  Run run(*this, {});
  for (int32_t t : tokens) run.advance(t);
  return run.need();
}

}  // namespace dsv4::constrain
