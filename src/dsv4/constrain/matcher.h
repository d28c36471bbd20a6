// A grammar bound to a vocabulary: the LogitConstraint the generator applies. The pushdown
// automaton (grammar.h) is made fast by memoization, lazily, per grammar:
//   - every set of stacks met gets an id, and each (id, symbol) step is computed once, so the
//     automaton becomes a DFA table filled on demand;
//   - the mask of a state (which tokens may come next) is one depth-first walk over the
//     vocabulary trie (token_trie.h) that follows the table and skips every subtree whose
//     prefix is refused; masks are cached per state, so the many steps spent in the same
//     situation (inside a string, say) cost a copy.
// Both caches are bounded (kMaxStates, kMaxMasks) and start over when full, so a hostile
// grammar costs time, never unbounded memory. One CompiledConstraint may serve many
// generations, one after another or at once (a mutex guards the caches).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsv4/constrain/grammar.h"
#include "dsv4/constrain/token_trie.h"
#include "dsv4/runtime/logit_constraint.h"

namespace dsv4::constrain {

inline constexpr size_t kMaxStates = 4096;  // interned sets of stacks before the tables start over
inline constexpr size_t kMaxMasks = 128;    // cached masks (each vocab/8 bytes)

class CompiledConstraint final : public LogitConstraint {
 public:
  // `grammar` must be finalized. Throws Error when the vocabulary lacks a special token the
  // grammar writes, or a single-byte token (every byte must be spellable).
  CompiledConstraint(Grammar grammar, std::shared_ptr<const TokenTrie> vocab);
  ~CompiledConstraint() override;

  std::unique_ptr<ConstrainedRun> begin(std::span<const int32_t> end_tokens) const override;
  int64_t min_tokens() const override;

  const Grammar& grammar() const { return grammar_; }
  const TokenTrie& vocab() const { return *vocab_; }
  // Bytes the caches hold now (grammar, state tables, masks; not the shared vocabulary).
  size_t memory_bytes() const;

  // For tests: which token ids may come after `tokens` (each must have been allowed), with
  // `tokens_left` for the next one and the rest (ConstrainedRun::mask).
  std::vector<bool> allowed_after(std::span<const int32_t> tokens, std::span<const int32_t> end_tokens,
                                  int64_t tokens_left = ConstrainedRun::kNoBudget) const;
  // For tests: tokens_to_finish() after `tokens`.
  uint64_t tokens_to_finish_after(std::span<const int32_t> tokens) const;

 private:
  class Run;
  struct Table;

  Grammar grammar_;
  std::shared_ptr<const TokenTrie> vocab_;
  std::vector<int32_t> special_ids_;  // token id of each special symbol
  mutable std::mutex mu_;
  std::unique_ptr<Table> table_;
};

}  // namespace dsv4::constrain
