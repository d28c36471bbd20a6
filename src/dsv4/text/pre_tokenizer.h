// Regex pre-tokenization: a chain of Hugging Face Split(pattern, behavior = Isolated) steps run
// with PCRE2 (UTF + UCP, JIT-compiled). Each step splits every piece of the previous step into its
// matches and the gaps between them; the last step's pieces are the words BPE sees.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

class RegexSplitter {
 public:
  RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;
  ~RegexSplitter();

  // Adds a step. `literal` = the pattern is a plain string (Split {"String": ...}). Throws Error
  // naming `where` if the pattern does not compile or can match the empty string.
  void add_step(std::string_view pattern, bool literal, const std::string& where);
  size_t steps() const;

  // Appends the pieces of `text` (which must be valid UTF-8) to `pieces`, in order, stopping
  // once `pieces` holds `max_pieces` (so a bounded encode never splits more of a huge text than
  // it can use). Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& pieces, size_t max_pieces = SIZE_MAX) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::text
