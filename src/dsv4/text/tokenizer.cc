#include "dsv4/text/tokenizer.h"

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

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<std::string_view>& pieces,
                                   std::vector<TokenId>& out) const {
  pieces.clear();
  splitter.split(text, pieces);
  for (std::string_view piece : pieces) bpe->encode_word(piece, out);
}

void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<std::string_view>& pieces,
                                        std::vector<TokenId>& out) const {
  size_t pos = 0;
  while (pos < text.size()) {
    const auto m = normalized_added.find(text, pos);
    if (m.end == 0) break;
    if (m.begin > pos) encode_plain(text.substr(pos, m.begin - pos), pieces, out);
    out.push_back(m.id);
    pos = m.end;
  }
  if (pos < text.size()) encode_plain(text.substr(pos), pieces, out);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = to_valid_utf8(text);
    text = repaired;
  }
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  std::vector<std::string_view> pieces;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto m = impl_->raw_added.find(text, pos);
    if (m.end == 0) break;
    if (m.begin > pos) impl_->encode_normalized(text.substr(pos, m.begin - pos), pieces, out);
    out.push_back(m.id);
    pos = m.end;
  }
  if (pos < text.size()) impl_->encode_normalized(text.substr(pos), pieces, out);
  return out;
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
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(TokenId id) {
  const std::string_view b = tokenizer_->impl_->bytes_of(id);
  if (skip_special_ && tokenizer_->impl_->special[static_cast<size_t>(id)]) return {};
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
