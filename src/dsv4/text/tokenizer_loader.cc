// tokenizer.json → Tokenizer::Impl. The file may be hostile: every size is capped, every id and
// reference is validated, and anything this tokenizer does not implement exactly is refused with
// one line naming the file and the JSON field.
#include <algorithm>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "dsv4/text/byte_level.h"
#include "dsv4/text/flat_string_map.h"
#include "dsv4/text/tokenizer_impl.h"
#include "dsv4/text/utf8.h"
#include "dsv4/util/error.h"

namespace dsv4::text {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

constexpr int64_t kMaxTokenId = (1 << 24) - 1;
constexpr size_t kMaxVocabEntries = 1 << 22;
constexpr size_t kMaxMerges = 1 << 22;
constexpr size_t kMaxAddedTokens = 1 << 16;
constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMaxAddedTokenBytes = 1024;
constexpr size_t kMaxPatternBytes = 16384;
constexpr size_t kMaxPreTokenizerSteps = 64;

class Fields {
 public:
  explicit Fields(const std::string& source) : source_(source) {}

  std::string where(const std::string& field) const { return source_ + ": " + field; }

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    fail("{}: {} {}", source_, field, what);
  }

  object obj(element e, const std::string& field) const {
    object o;
    if (e.get_object().get(o)) bad(field, "must be an object");
    return o;
  }
  simdjson::dom::array arr(element e, const std::string& field) const {
    simdjson::dom::array a;
    if (e.get_array().get(a)) bad(field, "must be an array");
    return a;
  }
  std::string_view str(element e, const std::string& field) const {
    std::string_view s;
    if (e.get_string().get(s)) bad(field, "must be a string");
    return s;
  }
  int64_t integer(element e, const std::string& field, int64_t lo, int64_t hi) const {
    int64_t v;
    if (e.get_int64().get(v)) bad(field, "must be an integer");
    if (v < lo || v > hi) bad(field, fmt::format("= {} is outside [{}, {}]", v, lo, hi));
    return v;
  }
  bool boolean(element e, const std::string& field) const {
    bool b;
    if (e.get_bool().get(b)) bad(field, "must be true or false");
    return b;
  }
  // Member `key` of `o`, or nothing if absent or null.
  std::optional<element> member(object o, std::string_view key) const {
    element e;
    if (o.at_key(key).get(e) || e.is_null()) return std::nullopt;
    return e;
  }
  element required(object o, std::string_view key, const std::string& field) const {
    auto e = member(o, key);
    if (!e) bad(field, "is missing");
    return *e;
  }
  bool flag(object o, std::string_view key, const std::string& prefix, bool fallback) const {
    auto e = member(o, key);
    return e ? boolean(*e, prefix + "." + std::string(key)) : fallback;
  }
  std::string type_of(object o, const std::string& field) const {
    return std::string(str(required(o, "type", field + ".type"), field + ".type"));
  }

 private:
  const std::string& source_;
};

struct PendingAdded {
  std::string content;
  TokenId id;
  bool special;
  bool normalized;
};

void load_normalizer(const Fields& f, object root) {
  auto n = f.member(root, "normalizer");
  if (!n) return;
  object o = f.obj(*n, "normalizer");
  const std::string type = f.type_of(o, "normalizer");
  if (type != "Sequence") f.bad("normalizer.type", fmt::format("= {:?} is unsupported (only null or an empty Sequence)", type));
  auto list = f.arr(f.required(o, "normalizers", "normalizer.normalizers"), "normalizer.normalizers");
  if (list.size() != 0) f.bad("normalizer.normalizers", "must be empty (normalizers are unsupported)");
}

void load_pre_tokenizer(const Fields& f, object root, RegexSplitter& splitter) {
  auto p = f.member(root, "pre_tokenizer");
  if (!p) f.bad("pre_tokenizer", "is missing (a ByteLevel pre-tokenizer is required)");
  object top = f.obj(*p, "pre_tokenizer");
  std::vector<std::pair<object, std::string>> steps;
  if (f.type_of(top, "pre_tokenizer") == "Sequence") {
    auto list = f.arr(f.required(top, "pretokenizers", "pre_tokenizer.pretokenizers"), "pre_tokenizer.pretokenizers");
    if (list.size() > kMaxPreTokenizerSteps) f.bad("pre_tokenizer.pretokenizers", "has too many steps");
    size_t i = 0;
    for (element e : list) {
      const std::string field = fmt::format("pre_tokenizer.pretokenizers[{}]", i++);
      steps.emplace_back(f.obj(e, field), field);
    }
  } else {
    steps.emplace_back(top, "pre_tokenizer");
  }
  bool byte_level_seen = false;
  for (const auto& [o, field] : steps) {
    const std::string type = f.type_of(o, field);
    if (byte_level_seen) f.bad(field, "follows ByteLevel (ByteLevel must be the last pre-tokenizer)");
    if (type == "Split") {
      const std::string behavior(f.str(f.required(o, "behavior", field + ".behavior"), field + ".behavior"));
      if (behavior != "Isolated") f.bad(field + ".behavior", fmt::format("= {:?} is unsupported (only Isolated)", behavior));
      if (f.flag(o, "invert", field, false)) f.bad(field + ".invert", "= true is unsupported");
      object pattern = f.obj(f.required(o, "pattern", field + ".pattern"), field + ".pattern");
      if (auto r = f.member(pattern, "Regex")) {
        const std::string_view text = f.str(*r, field + ".pattern.Regex");
        if (text.size() > kMaxPatternBytes) f.bad(field + ".pattern.Regex", "is too long");
        splitter.add_step(text, false, f.where(field + ".pattern.Regex"));
      } else if (auto s = f.member(pattern, "String")) {
        const std::string_view text = f.str(*s, field + ".pattern.String");
        if (text.empty() || text.size() > kMaxPatternBytes) f.bad(field + ".pattern.String", "must be 1 to 16384 bytes");
        splitter.add_step(text, true, f.where(field + ".pattern.String"));
      } else {
        f.bad(field + ".pattern", "must hold Regex or String");
      }
    } else if (type == "ByteLevel") {
      if (f.flag(o, "add_prefix_space", field, true)) f.bad(field + ".add_prefix_space", "= true is unsupported");
      if (f.flag(o, "use_regex", field, true)) f.bad(field + ".use_regex", "= true is unsupported (split with Split steps)");
      byte_level_seen = true;
    } else {
      f.bad(field + ".type", fmt::format("= {:?} is unsupported (only Split and ByteLevel)", type));
    }
  }
  if (!byte_level_seen) f.bad("pre_tokenizer", "has no ByteLevel step (only byte-level BPE is supported)");
}

void load_post_processor_and_decoder(const Fields& f, object root) {
  if (auto p = f.member(root, "post_processor")) {
    object o = f.obj(*p, "post_processor");
    const std::string type = f.type_of(o, "post_processor");
    if (type != "ByteLevel") f.bad("post_processor.type", fmt::format("= {:?} is unsupported (only null or ByteLevel)", type));
  }
  auto d = f.member(root, "decoder");
  if (!d) f.bad("decoder", "is missing (a ByteLevel decoder is required)");
  object o = f.obj(*d, "decoder");
  const std::string type = f.type_of(o, "decoder");
  if (type != "ByteLevel") f.bad("decoder.type", fmt::format("= {:?} is unsupported (only ByteLevel)", type));
  if (f.member(root, "truncation")) f.bad("truncation", "must be null (truncation is unsupported)");
  if (f.member(root, "padding")) f.bad("padding", "must be null (padding is unsupported)");
}


// Vocabulary keys in file order, as views into the parsed document (valid during loading).
struct Vocab {
  std::vector<std::pair<std::string_view, TokenId>> entries;
  std::vector<std::string_view> spelling_of;  // index = id; empty view = no entry
  size_t key_bytes = 0;
};

Vocab load_vocab(const Fields& f, object model) {
  object vocab = f.obj(f.required(model, "vocab", "model.vocab"), "model.vocab");
  if (vocab.size() > kMaxVocabEntries) f.bad("model.vocab", "has too many entries");
  Vocab v;
  v.entries.reserve(vocab.size());
  for (auto field : vocab) {
    const std::string_view key = field.key;
    if (key.empty() || key.size() > kMaxTokenBytes) f.bad("model.vocab", fmt::format("has a key of {} bytes", key.size()));
    int64_t raw = -1;
    if (field.value.get_int64().get(raw) || raw < 0 || raw > kMaxTokenId)  // field name formatted only on error
      f.integer(field.value, fmt::format("model.vocab[{:?}]", std::string(key)), 0, kMaxTokenId);
    const auto id = static_cast<TokenId>(raw);
    if (static_cast<size_t>(id) >= v.spelling_of.size()) v.spelling_of.resize(static_cast<size_t>(id) + 1);
    if (!v.spelling_of[static_cast<size_t>(id)].empty())
      f.bad(fmt::format("model.vocab[{:?}]", std::string(key)), fmt::format("= {} repeats the id of {:?}", id, std::string(v.spelling_of[static_cast<size_t>(id)])));
    v.spelling_of[static_cast<size_t>(id)] = key;
    v.entries.emplace_back(key, id);
    v.key_bytes += key.size();
  }
  return v;
}

FlatPairMap<BpeModel::Merge> load_merges(const Fields& f, object model, const FlatStringMap& by_spelling,
                                         const std::vector<bool>& byte_level_id) {
  auto list = f.arr(f.required(model, "merges", "model.merges"), "model.merges");
  if (list.size() > kMaxMerges) f.bad("model.merges", "has too many entries");
  FlatPairMap<BpeModel::Merge> merges;
  merges.reserve(list.size());
  uint32_t rank = 0;
  std::string joined;
  for (element e : list) {
    std::string_view left, right;
    if (e.is_string()) {
      const std::string_view line = f.str(e, "model.merges");
      const size_t space = line.find(' ');
      if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
        f.bad(fmt::format("model.merges[{}]", rank), fmt::format("= {:?} is not two tokens separated by one space", std::string(line)));
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {
      const std::string field = fmt::format("model.merges[{}]", rank);
      auto pair = f.arr(e, field);
      if (pair.size() != 2) f.bad(field, "must be a string \"a b\" or a pair [\"a\", \"b\"]");
      left = f.str(pair.at(0).value(), field + "[0]");
      right = f.str(pair.at(1).value(), field + "[1]");
    }
    const auto find = [&](std::string_view token) -> TokenId {
      const TokenId id = by_spelling.find(token);
      if (id < 0) f.bad(fmt::format("model.merges[{}]", rank), fmt::format("uses {:?}, which is not in model.vocab", std::string(token)));
      return id;
    };
    const TokenId a = find(left), b = find(right);
    joined.assign(left).append(right);
    const TokenId result = find(joined);
    // A merge of tokens that are not byte-level spellings can never fire on byte-level input,
    // so it is skipped; the ranks of the others keep their relative order.
    if (byte_level_id[static_cast<size_t>(a)] && byte_level_id[static_cast<size_t>(b)])
      merges.put(BpeModel::pair_key(a, b), {rank, result});  // a repeated pair keeps its last rank, as in HF
    ++rank;
  }
  return merges;
}

std::vector<PendingAdded> load_added_tokens(const Fields& f, object root) {
  std::vector<PendingAdded> out;
  auto a = f.member(root, "added_tokens");
  if (!a) return out;
  auto list = f.arr(*a, "added_tokens");
  if (list.size() > kMaxAddedTokens) f.bad("added_tokens", "has too many entries");
  size_t i = 0;
  for (element e : list) {
    const std::string field = fmt::format("added_tokens[{}]", i++);
    object o = f.obj(e, field);
    PendingAdded t;
    t.id = static_cast<TokenId>(f.integer(f.required(o, "id", field + ".id"), field + ".id", 0, kMaxTokenId));
    t.content = std::string(f.str(f.required(o, "content", field + ".content"), field + ".content"));
    if (t.content.empty() || t.content.size() > kMaxAddedTokenBytes) f.bad(field + ".content", "must be 1 to 1024 bytes");
    t.special = f.flag(o, "special", field, false);
    t.normalized = f.flag(o, "normalized", field, !t.special);
    for (const char* unsupported : {"single_word", "lstrip", "rstrip"})
      if (f.flag(o, unsupported, field, false)) f.bad(field + "." + unsupported, "= true is unsupported");
    out.push_back(std::move(t));
  }
  return out;
}

std::optional<TokenId> config_token(const nlohmann::json& config, const char* key, const std::string& config_source,
                                    const Tokenizer::Impl& impl) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    text = (*it)["content"].get<std::string>();
  } else {
    fail("{}: {} must be a string or an object with a string content", config_source, key);
  }
  if (auto a = impl.added_by_text.find(text); a != impl.added_by_text.end()) return a->second;
  if (const TokenId id = impl.vocab_by_spelling.find(text); id >= 0) return id;
  fail("{}: {} = {:?} is not a token of the tokenizer", config_source, key, text);
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> load_tokenizer(std::string_view json, const std::string& source,
                                                std::string_view config_json, const std::string& config_source) {
  Fields f(source);
  simdjson::dom::parser parser;
  element doc;
  if (auto error = parser.parse(json.data(), json.size(), /*realloc_if_needed=*/false).get(doc)) fail("{}: not valid JSON: {}", source, simdjson::error_message(error));
  object root = f.obj(doc, "top level");

  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = source;
  load_normalizer(f, root);
  load_pre_tokenizer(f, root, impl->splitter);
  load_post_processor_and_decoder(f, root);

  object model = f.obj(f.required(root, "model", "model"), "model");
  const std::string type = f.type_of(model, "model");
  if (type != "BPE") f.bad("model.type", fmt::format("= {:?} is unsupported (only BPE)", type));
  if (auto d = f.member(model, "dropout")) f.bad("model.dropout", "must be null (dropout is unsupported)");
  if (f.flag(model, "byte_fallback", "model", false)) f.bad("model.byte_fallback", "= true is unsupported");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto a = f.member(model, affix); a && !f.str(*a, std::string("model.") + affix).empty())
      f.bad(std::string("model.") + affix, "must be null or empty (unsupported)");
  const bool ignore_merges = f.flag(model, "ignore_merges", "model", false);

  Vocab vocab = load_vocab(f, model);
  const std::vector<PendingAdded> added = load_added_tokens(f, root);
  static const ByteLevelAlphabet alphabet;

  // Spellings and decoded bytes go to two arenas reserved exactly, so the views taken below stay
  // valid; the one spelling index is built over them and serves the merges and token_id().
  size_t added_bytes = 0;
  for (const PendingAdded& t : added) added_bytes += t.content.size();
  impl->spelling_arena.reserve(vocab.key_bytes + added_bytes);
  impl->bytes_arena.reserve(vocab.key_bytes + added_bytes);
  const auto keep = [](std::string& arena, std::string_view text) {
    const size_t at = arena.size();
    arena.append(text);
    return std::string_view(arena.data() + at, text.size());
  };
  std::vector<bool> byte_level_id(vocab.spelling_of.size(), false);
  std::vector<std::string_view> vocab_bytes(vocab.spelling_of.size());
  std::array<TokenId, 256> byte_tokens;
  byte_tokens.fill(-1);
  impl->vocab_by_spelling.reserve(vocab.entries.size());
  if (ignore_merges) impl->vocab_by_bytes.reserve(vocab.entries.size());
  for (const auto& [key, id] : vocab.entries) {
    const auto i = static_cast<size_t>(id);
    const std::string_view spelling = keep(impl->spelling_arena, key);
    if (!impl->vocab_by_spelling.insert(spelling, id)) f.bad("model.vocab", fmt::format("repeats the key {:?}", std::string(key)));
    vocab.spelling_of[i] = spelling;
    // The ByteLevel decoder maps a token made of alphabet characters to its bytes and passes any
    // other token through as its UTF-8 text.
    auto b = alphabet.to_bytes(key);
    vocab_bytes[i] = keep(impl->bytes_arena, b ? *b : key);
    if (!b) continue;
    byte_level_id[i] = true;
    if (b->size() == 1) byte_tokens[static_cast<uint8_t>((*b)[0])] = id;
    if (ignore_merges) impl->vocab_by_bytes.insert(vocab_bytes[i], id);
  }
  if (auto unk = f.member(model, "unk_token")) {
    // An unknown-token fallback only matters for a byte that has no token; refuse rather than
    // emulate Hugging Face's fuse_unk rules for a case byte-level vocabularies never have.
    f.str(*unk, "model.unk_token");
    for (TokenId id : byte_tokens)
      if (id < 0) f.bad("model.unk_token", "is set but not every byte has a token (unsupported)");
  }
  auto merges = load_merges(f, model, impl->vocab_by_spelling, byte_level_id);

  // Added tokens: Hugging Face re-derives each id (the vocabulary id when the text is a vocab key,
  // otherwise the next free id after the vocabulary); a file whose ids disagree would encode
  // differently there, so it is refused.
  TokenId max_added = -1;
  size_t size = vocab.spelling_of.size();
  for (size_t i = 0; i < added.size(); ++i) {
    const PendingAdded& t = added[i];
    const std::string field = fmt::format("added_tokens[{}]", i);
    if (impl->added_by_text.count(t.content)) f.bad(field + ".content", fmt::format("repeats {:?}", t.content));
    TokenId expected = impl->vocab_by_spelling.find(t.content);
    if (expected < 0) {
      const auto model_size = static_cast<TokenId>(vocab.entries.size());
      expected = max_added < 0 ? model_size : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
      if (static_cast<size_t>(expected) < vocab.spelling_of.size() && !vocab.spelling_of[static_cast<size_t>(expected)].empty())
        f.bad(field + ".id", fmt::format("= {} collides with the vocabulary entry {:?}", expected,
                                         std::string(vocab.spelling_of[static_cast<size_t>(expected)])));
    }
    if (t.id != expected)
      f.bad(field + ".id", fmt::format("= {} but Hugging Face tokenizers would give {:?} the id {}", t.id, t.content, expected));
    max_added = std::max(max_added, t.id);
    impl->added_by_text.emplace(t.content, t.id);
    size = std::max(size, static_cast<size_t>(t.id) + 1);
  }

  impl->present.assign(size, false);
  impl->added.assign(size, false);
  impl->special.assign(size, false);
  impl->spelling.assign(size, {});
  impl->bytes.assign(size, {});
  for (const auto& [key, id] : vocab.entries) {
    const auto i = static_cast<size_t>(id);
    impl->present[i] = true;
    impl->spelling[i] = vocab.spelling_of[i];
    impl->bytes[i] = vocab_bytes[i];
  }
  for (const PendingAdded& t : added) {
    const auto i = static_cast<size_t>(t.id);
    impl->present[i] = true;
    impl->added[i] = true;
    impl->special[i] = t.special;
    impl->spelling[i] = keep(impl->spelling_arena, t.content);
    auto b = alphabet.to_bytes(t.content);
    impl->bytes[i] = keep(impl->bytes_arena, b ? *b : t.content);
    (t.normalized ? impl->normalized_added : impl->raw_added).add(t.content, t.id);
  }
  impl->bpe = std::make_unique<BpeModel>(byte_tokens, std::move(merges), ignore_merges ? &impl->vocab_by_bytes : nullptr);
  impl->byte_tokens = byte_tokens;
  impl->every_byte = std::all_of(byte_tokens.begin(), byte_tokens.end(), [](TokenId id) { return id >= 0; });
  for (size_t i = 0; i < size; ++i) {
    const size_t n = impl->bytes[i].size();
    impl->longest_token_bytes = std::max(impl->longest_token_bytes, n);
    if (!impl->added[i]) impl->longest_word_bytes = std::max(impl->longest_word_bytes, n);
  }

  if (!config_json.empty()) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(config_json);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", config_source, e.what());
    }
    if (!config.is_object()) fail("{}: top level must be an object", config_source);
    impl->bos = config_token(config, "bos_token", config_source, *impl);
    impl->eos = config_token(config, "eos_token", config_source, *impl);
  }
  return impl;
}

}  // namespace dsv4::text
