#include "dsv4/text/tokenizer.h"

#include <algorithm>

#include <simdjson.h>

#include "dsv4/text/tokenizer_impl.h"
#include "dsv4/text/utf8.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4::text {
namespace {

constexpr uint64_t kMaxTokenizerJsonBytes = 256ull << 20;
constexpr uint64_t kMaxConfigJsonBytes = 1ull << 20;

std::string sibling(const std::string& path, const std::string& name) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? name : path.substr(0, slash + 1) + name;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  // Read straight into simdjson's padded buffer: one 8 MB copy fewer than via std::string.
  const File file = File::open_read(path);
  const uint64_t size = file.size();
  if (size > kMaxTokenizerJsonBytes) fail("{}: {} bytes is larger than the {} byte limit", path, size, kMaxTokenizerJsonBytes);
  simdjson::padded_string json(static_cast<size_t>(size));
  file.read_exact(json.data(), size, 0);
  const std::string config_path = sibling(path, "tokenizer_config.json");
  std::string config;
  if (path_exists(config_path)) config = read_small_file(config_path, kMaxConfigJsonBytes);
  return Tokenizer(load_tokenizer(json, path, config, config_path));
}

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& source, std::string_view config_json,
                               const std::string& config_source) {
  const simdjson::padded_string padded(json);
  return Tokenizer(load_tokenizer(padded, source, config_json, config_source));
}

namespace {

size_t saturating_mul(size_t a, size_t b) { return b != 0 && a > SIZE_MAX / b ? SIZE_MAX : a * b; }

// `text` made valid UTF-8 range by range (plain ranges and the text between them each on their
// own), so the ranges still say which bytes came from where.
struct Repaired {
  std::string text;
  std::vector<TextRange> plain;
};
Repaired repair(std::string_view text, std::span<const TextRange> plain) {
  Repaired r;
  size_t pos = 0;
  for (const TextRange& range : plain) {
    r.text += to_valid_utf8(text.substr(pos, range.begin - pos));
    const size_t begin = r.text.size();
    r.text += to_valid_utf8(text.substr(range.begin, range.end - range.begin));
    r.plain.push_back({begin, r.text.size()});
    pos = range.end;
  }
  r.text += to_valid_utf8(text.substr(pos));
  return r;
}

// One encode: added tokens are matched outside the plain ranges in two passes, as Hugging Face
// does (those with normalized=false first, then the others in the text between), and the text
// between matches is pre-tokenized and BPE-encoded. Every step stops once max_tokens is reached.
class Encoder {
 public:
  Encoder(const Tokenizer::Impl& t, std::string_view text, std::span<const TextRange> plain, size_t max_tokens)
      : t_(t), text_(text), plain_(plain), max_(max_tokens) {
    out_.reserve(std::min(text.size() / 3 + 4, max_tokens));
  }

  std::vector<TokenId> run() && {
    size_t pos = 0;
    while (pos < text_.size() && !full()) {
      const auto m = find_outside(t_.raw_added, pos, text_.size());
      encode_normalized(pos, m.end ? m.begin : text_.size());
      if (!m.end || full()) break;
      out_.push_back(m.id);
      pos = m.end;
    }
    if (out_.size() > max_) out_.resize(max_);
    return std::move(out_);
  }

 private:
  bool full() const { return out_.size() >= max_; }

  // The leftmost-longest match in text[from, to) that lies entirely outside the plain ranges:
  // the text outside them is searched stretch by stretch.
  AddedTokenMatcher::Match find_outside(const AddedTokenMatcher& matcher, size_t from, size_t to) const {
    if (matcher.empty()) return {0, 0, -1};
    auto range = std::partition_point(plain_.begin(), plain_.end(), [&](const TextRange& r) { return r.end <= from; });
    for (size_t stretch = from; stretch < to; ++range) {
      const bool before_range = range != plain_.end() && range->begin < to;
      const size_t stretch_end = before_range ? std::max(stretch, range->begin) : to;
      if (stretch_end > stretch)
        if (const auto m = matcher.find(text_.substr(0, stretch_end), stretch); m.end != 0) return m;
      if (!before_range) break;
      stretch = std::max(stretch, range->end);
    }
    return {0, 0, -1};
  }

  void encode_normalized(size_t pos, size_t end) {
    while (pos < end && !full()) {
      const auto m = find_outside(t_.normalized_added, pos, end);
      encode_words(text_.substr(pos, (m.end ? m.begin : end) - pos));
      if (!m.end || full()) return;
      out_.push_back(m.id);
      pos = m.end;
    }
  }

  // Pre-tokenized words, BPE-encoded; no more words than tokens are still wanted (each word
  // makes at least one token when every byte has one).
  void encode_words(std::string_view text) {
    if (text.empty()) return;
    pieces_.clear();
    t_.splitter.split(text, pieces_, t_.every_byte ? max_ - out_.size() : SIZE_MAX);
    for (std::string_view piece : pieces_) {
      if (full()) return;
      const size_t room = max_ - out_.size();
      if (t_.every_byte && piece.size() >= saturating_mul(room, t_.longest_word_bytes)) {
        // This word alone makes at least `room` tokens: the count is all that is wanted, and
        // merging a huge word would cost memory in proportion to it.
        for (size_t i = 0; i < room; ++i) out_.push_back(t_.byte_tokens[static_cast<uint8_t>(piece[i])]);
        return;
      }
      t_.bpe->encode_word(piece, out_);
    }
  }

  const Tokenizer::Impl& t_;
  std::string_view text_;
  std::span<const TextRange> plain_;
  size_t max_;
  std::vector<TokenId> out_;
  std::vector<std::string_view> pieces_;
};

}  // namespace

std::vector<TokenId> Tokenizer::encode(std::string_view text) const { return encode(text, {}, SIZE_MAX); }

std::vector<TokenId> Tokenizer::encode_plain(std::string_view text, size_t max_tokens) const {
  const TextRange all{0, text.size()};
  return encode(text, std::span(&all, 1), max_tokens);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, std::span<const TextRange> plain, size_t max_tokens) const {
  for (size_t i = 0; i < plain.size(); ++i)
    if (plain[i].begin > plain[i].end || plain[i].end > text.size() || (i > 0 && plain[i].begin < plain[i - 1].end))
      fail("tokenizer: the plain ranges must be sorted, disjoint and inside the text");
  // More bytes than max_tokens tokens can cover make at least max_tokens tokens: the rest of the
  // text cannot change the answer, so it is not looked at (the + 4 leaves a character cut at the
  // end, repaired to U+FFFD, still long enough).
  const size_t enough = saturating_mul(max_tokens, impl_->longest_token_bytes);
  if (impl_->every_byte && enough < SIZE_MAX - 4 && text.size() > enough + 4) text = text.substr(0, enough + 4);
  std::vector<TextRange> clipped;
  if (!plain.empty() && plain.back().end > text.size()) {
    for (const TextRange& r : plain)
      if (r.begin < text.size()) clipped.push_back({r.begin, std::min(r.end, text.size())});
    plain = clipped;
  }
  if (!is_valid_utf8(text)) {
    const Repaired r = repair(text, plain);
    return Encoder(*impl_, r.text, r.plain, max_tokens).run();
  }
  return Encoder(*impl_, text, plain, max_tokens).run();
}

std::string_view Tokenizer::Impl::bytes_of(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= present.size() || !present[static_cast<size_t>(id)])
    fail("token id {} is not in the vocabulary of {} (size {})", id, source, present.size());
  return bytes[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string raw;
  for (TokenId id : ids) {
    const std::string_view b = impl_->bytes_of(id);
    if (skip_special && impl_->special[static_cast<size_t>(id)]) continue;
    raw += b;
  }
  return to_valid_utf8(raw);
}

std::string Tokenizer::token_bytes(TokenId id) const { return std::string(impl_->bytes_of(id)); }

std::vector<size_t> Tokenizer::token_offsets(std::span<const TokenId> ids) const {
  std::vector<size_t> offsets(ids.size() + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i) offsets[i + 1] = offsets[i] + impl_->bytes_of(ids[i]).size();
  return offsets;
}

std::optional<TokenId> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_by_text.find(token); it != impl_->added_by_text.end()) return it->second;
  if (const TokenId id = impl_->vocab_by_spelling.find(token); id >= 0) return id;
  return std::nullopt;
}

TokenId Tokenizer::require_token_id(std::string_view token) const {
  if (auto id = token_id(token)) return *id;
  fail("token {:?} is not in the vocabulary of {}", std::string(token), impl_->source);
}

std::string Tokenizer::token_string(TokenId id) const {
  impl_->bytes_of(id);  // validates
  return std::string(impl_->spelling[static_cast<size_t>(id)]);
}

bool Tokenizer::contains(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->present.size() && impl_->present[static_cast<size_t>(id)];
}
bool Tokenizer::is_special(TokenId id) const { return contains(id) && impl_->special[static_cast<size_t>(id)]; }
bool Tokenizer::is_added(TokenId id) const { return contains(id) && impl_->added[static_cast<size_t>(id)]; }
TokenId Tokenizer::vocab_size() const { return static_cast<TokenId>(impl_->present.size()); }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }
size_t Tokenizer::cached_words() const { return impl_->bpe->cached_words(); }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer) {
  if (skip_special) show_special_ = [](TokenId) { return false; };
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, ShowSpecial show_special)
    : tokenizer_(&tokenizer), show_special_(std::move(show_special)) {}

std::string IncrementalDecoder::push(TokenId id) {
  const std::string_view b = tokenizer_->impl_->bytes_of(id);
  if (show_special_ && tokenizer_->impl_->special[static_cast<size_t>(id)] && !show_special_(id)) return {};
  pending_ += b;
  std::string out;
  const size_t used = append_utf8_lossy(pending_, /*final=*/false, out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::finish() {
  std::string out;
  append_utf8_lossy(pending_, /*final=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace dsv4::text
