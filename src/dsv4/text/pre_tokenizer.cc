#include "dsv4/text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "dsv4/text/unicode_delta.h"
#include "dsv4/util/error.h"

namespace dsv4::text {
namespace {

// Backtracking budget per match: far above what any real tokenizer pattern needs on any input,
// low enough that a hostile pattern cannot stall a request thread.
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr uint32_t kDepthLimit = 100'000;

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct ContextDeleter {
  void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct RegexSplitter::Impl {
  std::vector<std::unique_ptr<pcre2_code, CodeDeleter>> steps;
  std::vector<bool> jitted;
  std::unique_ptr<pcre2_match_context, ContextDeleter> context{pcre2_match_context_create(nullptr)};
  uint32_t max_capture_pairs = 1;

  // false once `pieces` is full (max_pieces): the caller stops splitting.
  bool split_step(size_t step, std::string_view text, pcre2_match_data* match, std::vector<std::string_view>& pieces,
                  size_t max_pieces) const {
    if (step == steps.size()) {
      pieces.push_back(text);
      return pieces.size() < max_pieces;
    }
    const pcre2_code* code = steps[step].get();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t previous_end = 0;
    while (previous_end < text.size()) {
      const int rc = jitted[step]
                         ? pcre2_jit_match(code, subject, text.size(), previous_end, 0, match, context.get())
                         : pcre2_match(code, subject, text.size(), previous_end, PCRE2_NO_UTF_CHECK, match,
                                       context.get());
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) fail("pre-tokenizer regex step {} failed on the input: {}", step, pcre2_message(rc));
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t begin = ovector[0], end = ovector[1];
      if (end <= begin || begin < previous_end || end > text.size())
        fail("pre-tokenizer regex step {} returned an empty or invalid match", step);
      if (begin > previous_end &&
          !split_step(step + 1, text.substr(previous_end, begin - previous_end), match, pieces, max_pieces))
        return false;
      if (!split_step(step + 1, text.substr(begin, end - begin), match, pieces, max_pieces)) return false;
      previous_end = end;
    }
    return previous_end >= text.size() || split_step(step + 1, text.substr(previous_end), match, pieces, max_pieces);
  }
};

RegexSplitter::RegexSplitter() : impl_(std::make_unique<Impl>()) {
  if (!impl_->context) fail("out of memory creating a PCRE2 match context");
  pcre2_set_match_limit(impl_->context.get(), kMatchLimit);
  pcre2_set_depth_limit(impl_->context.get(), kDepthLimit);
}
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;
RegexSplitter::~RegexSplitter() = default;

size_t RegexSplitter::steps() const { return impl_->steps.size(); }

void RegexSplitter::add_step(std::string_view pattern, bool literal, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL allows only a few other options (UCP and NEVER_BACKSLASH_C are not among them).
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C;
  // Regexes see Unicode 16 character classes, as in Hugging Face (see unicode_delta.h).
  const std::string source = literal ? std::string(pattern) : widen_unicode_classes(pattern);
  std::unique_ptr<pcre2_code, CodeDeleter> code(pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &error, &offset, nullptr));
  if (!code) {
    if (source.size() != pattern.size()) {
      // Report the position in the pattern as written, not in the widened one.
      std::unique_ptr<pcre2_code, CodeDeleter> plain(pcre2_compile(
          reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr));
    }
    fail("{}: regex does not compile at offset {}: {}", where, offset, pcre2_message(error));
  }
  uint32_t min_length = 0;
  pcre2_pattern_info(code.get(), PCRE2_INFO_MINLENGTH, &min_length);
  // Hugging Face's handling of empty matches depends on Oniguruma's iteration details; no real
  // tokenizer needs them, so such patterns are refused instead of guessed at.
  if (min_length == 0) fail("{}: regex can match the empty string (unsupported)", where);
  uint32_t captures = 0;
  pcre2_pattern_info(code.get(), PCRE2_INFO_CAPTURECOUNT, &captures);
  impl_->max_capture_pairs = std::max(impl_->max_capture_pairs, captures + 1);
  impl_->jitted.push_back(pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE) == 0);
  impl_->steps.push_back(std::move(code));
}

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces, size_t max_pieces) const {
  if (text.empty() || pieces.size() >= max_pieces) return;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create(impl_->max_capture_pairs, nullptr));
  if (!match) fail("out of memory creating PCRE2 match data");
  impl_->split_step(0, text, match.get(), pieces, max_pieces);
}

}  // namespace dsv4::text
