#include "dsv4/server/prefix_store.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include <fmt/format.h>
#include <xxhash.h>

#include "dsv4/model/session_io.h"
#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4::server {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'P', 'F', 'X', 2};
constexpr size_t kHeaderBytes = 80;
constexpr uint64_t kBlockFlag = 1, kOwnFlag = 2;
constexpr const char* kSuffix = ".dsv4p";
constexpr const char* kTempSuffix = ".partial";
constexpr size_t kIoChunk = size_t{1} << 20;
constexpr uint64_t kSampleBytes = 64 << 10;  // of each shard's start and end, for the identity
constexpr uint64_t kMaxTextBytes = uint64_t{1} << 32;

// The header after the magic: checksum, then the checksummed fields.
struct Header {
  uint64_t checksum = 0;
  StoreIdentity identity{};
  uint64_t key_tokens = 0, state_tokens = 0, text_bytes = 0, state_bytes = 0;
  uint64_t parent_tokens = 0;  // 0: the session is whole
  uint64_t flags = 0;          // kBlockFlag, kOwnFlag
};
static_assert(8 + 8 + 16 + 6 * 8 == kHeaderBytes);

void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::array<uint8_t, kHeaderBytes> encode(const Header& h) {
  std::array<uint8_t, kHeaderBytes> b{};
  std::memcpy(b.data(), kMagic, 8);
  put_u64(b.data() + 8, h.checksum);
  std::memcpy(b.data() + 16, h.identity.data(), 16);
  put_u64(b.data() + 32, h.key_tokens);
  put_u64(b.data() + 40, h.state_tokens);
  put_u64(b.data() + 48, h.text_bytes);
  put_u64(b.data() + 56, h.state_bytes);
  put_u64(b.data() + 64, h.parent_tokens);
  put_u64(b.data() + 72, h.flags);
  return b;
}

std::string hex(const uint8_t* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}


bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Feeds whole files (or ranges of them) into a 128-bit hash.
class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) { XXH3_128bits_reset(state_); }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void add(const void* data, size_t n) { XXH3_128bits_update(state_, data, n); }
  void add(const std::string& s) {
    const uint64_t n = s.size();
    add(&n, 8);
    add(s.data(), s.size());
  }
  void add_range(const File& f, uint64_t offset, uint64_t length) {
    std::vector<uint8_t> buf(std::min<uint64_t>(length, kIoChunk));
    while (length > 0) {
      const uint64_t n = std::min<uint64_t>(length, buf.size());
      f.read_exact(buf.data(), n, offset);
      add(buf.data(), n);
      offset += n;
      length -= n;
    }
  }
  StoreIdentity digest() const {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    StoreIdentity out;
    std::memcpy(out.data(), c.digest, 16);
    return out;
  }

 private:
  XXH3_state_t* state_;
};

// Whether `path` is a regular file (symbolic links followed), found without blocking: the
// open does not block (platform::open_read), so a FIFO without a writer cannot hang it.
bool regular_file(const std::string& path) {
  const int fd = platform::open_read(path);
  if (fd < 0) return true;  // let the real open report why
  platform::FileInfo st;
  const bool regular = platform::stat_file(fd, &st) && st.regular;
  platform::close_file(fd);
  return regular;
}

// An error's text without a leading "PATH: ", for messages that name the path themselves.
std::string without_path(const std::string& message, const std::string& path) {
  const std::string prefix = path + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

// A descriptor that closes itself.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) platform::close_file(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Buffered writes to a descriptor, hashing everything written (XXH3-64).
class FileSink : public ByteSink {
 public:
  FileSink(int fd, uint64_t offset) : fd_(fd), offset_(offset), state_(XXH3_createState()) {
    XXH3_64bits_reset(state_);
    buf_.reserve(kIoChunk);
  }
  ~FileSink() override { XXH3_freeState(state_); }
  void write(const void* data, size_t n) override {
    XXH3_64bits_update(state_, data, n);
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const size_t take = std::min(n, kIoChunk - buf_.size());
      buf_.insert(buf_.end(), p, p + take);
      p += take;
      n -= take;
      if (buf_.size() == kIoChunk) flush();
    }
  }
  void flush() {
    size_t done = 0;
    while (done < buf_.size()) {
      const int64_t w = platform::pwrite(fd_, buf_.data() + done, buf_.size() - done, offset_);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write failed: {}", std::strerror(errno));
      done += static_cast<size_t>(w);
      offset_ += static_cast<uint64_t>(w);
    }
    buf_.clear();
  }
  uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  int fd_;
  uint64_t offset_;
  XXH3_state_t* state_;
  std::vector<uint8_t> buf_;
};

// Buffered reads of [offset, end) of a file, hashing everything read.
class FileSource : public ByteSource {
 public:
  FileSource(const File& f, uint64_t offset, uint64_t end) : file_(f), offset_(offset), end_(end), state_(XXH3_createState()) {
    XXH3_64bits_reset(state_);
  }
  ~FileSource() override { XXH3_freeState(state_); }
  void read(void* data, size_t n) override {
    if (n > remaining()) fail("truncated: {} bytes wanted, {} left", n, remaining());
    auto* out = static_cast<uint8_t*>(data);
    while (n > 0) {
      if (at_ == buf_.size()) refill();
      const size_t take = std::min(n, buf_.size() - at_);
      std::memcpy(out, buf_.data() + at_, take);
      XXH3_64bits_update(state_, out, take);
      at_ += take;
      out += take;
      n -= take;
    }
  }
  uint64_t remaining() const override { return end_ - offset_ + (buf_.size() - at_); }
  uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  void refill() {
    const uint64_t n = std::min<uint64_t>(kIoChunk, end_ - offset_);
    buf_.resize(n);
    file_.read_exact(buf_.data(), n, offset_);
    offset_ += n;
    at_ = 0;
  }
  const File& file_;
  uint64_t offset_, end_;
  XXH3_state_t* state_;
  std::vector<uint8_t> buf_;
  size_t at_ = 0;
};

}  // namespace

StoreIdentity store_identity(const Engine& engine) {
  Hasher h;
  h.add(std::string("dsv4 prefix store v2"));
  h.add(std::string(engine.numerics() == kernels::Numerics::kReference ? "reference" : "fast"));
  // This executable: a different build may compute different states.
  {
    const File self = File::open_read(platform::executable_path());
    h.add_range(self, 0, self.size());
  }
  const std::string& dir = engine.checkpoint().dir();
  for (const char* name : {"config.json", "model.safetensors.index.json"}) {
    const std::string path = dir + "/" + name;
    h.add(path_exists(path) ? read_small_file(path, 64 << 20) : std::string());
  }
  for (const auto& shard : engine.checkpoint().shards()) {
    platform::FileInfo st;
    if (!platform::stat_path(shard->path(), &st)) fail("{}: cannot stat: {}", shard->path(), std::strerror(errno));
    const std::string base = shard->path().substr(shard->path().rfind('/') + 1);
    h.add(base);
    const uint64_t size = st.size;
    const int64_t mt = st.mtime_ns;
    h.add(&size, 8);
    h.add(&mt, 8);
    const File f = File::open_read(shard->path());
    if (size <= 2 * kSampleBytes) {
      h.add_range(f, 0, size);
    } else {
      h.add_range(f, 0, kSampleBytes);
      h.add_range(f, size - kSampleBytes, kSampleBytes);
    }
  }
  return h.digest();
}

PrefixStore::PrefixStore(std::string dir, uint64_t max_bytes, StoreIdentity identity, StoreLimits limits, Warn warn)
    : dir_(std::move(dir)),
      max_bytes_(max_bytes),
      identity_(identity),
      identity_hex_(hex(identity.data(), 8)),
      limits_(limits),
      warn_(std::move(warn)) {
  if (!platform::make_directory(dir_))
    fail("--cache-dir {}: cannot create it: {}", dir_, std::strerror(errno));
  if (!is_directory(dir_)) fail("--cache-dir {}: not a directory", dir_);
  if (!platform::can_write_directory(dir_)) fail("--cache-dir {}: not writable: {}", dir_, std::strerror(errno));
  scan();
  evict("");
}

std::string PrefixStore::file_name(std::span<const int32_t> key) const {
  Hasher h;
  h.add(identity_.data(), identity_.size());
  h.add(key.data(), key.size_bytes());
  const StoreIdentity d = h.digest();
  return identity_hex_ + "-" + hex(d.data(), 16) + kSuffix;
}

void PrefixStore::scan() {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(platform::fs_path(dir_), ec), end; !ec && it != end; it.increment(ec))
    names.push_back(platform::utf8_path(it->path().filename()));
  if (ec) fail("--cache-dir {}: cannot list it: {}", dir_, ec.message());
  std::sort(names.begin(), names.end());

  size_t foreign = 0;
  for (const std::string& name : names) {
    const std::string path = dir_ + "/" + name;
    if (name.rfind("tmp-", 0) == 0 && ends_with(name, kTempSuffix)) {
      // tmp-<pid>-<n>.partial: an unfinished write; its writer is gone if the pid is.
      const int pid = std::atoi(name.c_str() + 4);
      if (!platform::process_alive(pid)) platform::remove_file(path);
      continue;
    }
    if (!ends_with(name, kSuffix)) continue;
    if (name.rfind(identity_hex_ + "-", 0) != 0) {
      ++foreign;
      continue;
    }
    if (!regular_file(path)) {
      // A FIFO, a device, a directory...: not ours to read (the open does not block) nor remove.
      warn_(fmt::format("--cache-dir: {} is not a regular file; ignored", path));
      continue;
    }
    try {
      const File f = File::open_read(path);
      platform::FileInfo st;
      if (!platform::stat_file(f.fd(), &st)) fail("cannot stat");
      const uint64_t size = st.size;
      if (size < kHeaderBytes) fail("truncated ({} bytes)", size);
      std::array<uint8_t, kHeaderBytes> b;
      f.read_exact(b.data(), kHeaderBytes, 0);
      if (std::memcmp(b.data(), kMagic, 8) != 0) fail("not a dsv4 prefix entry (bad magic)");
      // The name says this identity; a header that says another one is corrupted.
      if (std::memcmp(b.data() + 16, identity_.data(), 16) != 0) fail("its header does not match its name (corrupted)");
      const uint64_t key_tokens = get_u64(b.data() + 32), state_tokens = get_u64(b.data() + 40),
                     text_bytes = get_u64(b.data() + 48), state_bytes = get_u64(b.data() + 56),
                     parent_tokens = get_u64(b.data() + 64), flags = get_u64(b.data() + 72);
      if (key_tokens > size / 4 || text_bytes > kMaxTextBytes || state_tokens > key_tokens ||
          kHeaderBytes + 4 * key_tokens + text_bytes + state_bytes != size)
        fail("truncated or garbled (its sizes do not add up to its {} bytes)", size);
      if (parent_tokens >= std::max<uint64_t>(state_tokens, 1) || (flags & ~(kBlockFlag | kOwnFlag)) != 0 ||
          ((flags & kBlockFlag) && state_tokens != key_tokens))
        fail("garbled (parent {} tokens, flags {:#x})", parent_tokens, flags);
      StoredPrefix e;
      e.key.resize(key_tokens);
      if (key_tokens) f.read_exact(e.key.data(), 4 * key_tokens, kHeaderBytes);
      e.text.resize(text_bytes);
      if (text_bytes) f.read_exact(e.text.data(), text_bytes, kHeaderBytes + 4 * key_tokens);
      e.state_tokens = state_tokens;
      e.file = name;
      e.bytes = size;
      e.mtime_ns = st.mtime_ns;
      e.parent_tokens = parent_tokens;
      if (parent_tokens > 0) e.parent_file = file_name(std::span(e.key).first(parent_tokens));
      e.block = (flags & kBlockFlag) != 0;
      e.own = (flags & kOwnFlag) != 0;
      bytes_ += size;
      entries_.push_back(std::move(e));
    } catch (const Error& err) {
      warn_(fmt::format("{}: {}; removed", path, without_path(err.what(), path)));
      platform::remove_file(path);
    }
  }
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const StoredPrefix& a, const StoredPrefix& b) { return a.mtime_ns > b.mtime_ns; });
  // Link children to parents; an entry whose parent is gone (or is no block snapshot of its
  // prefix) can never be rebuilt: removed, and so on down its chain.
  size_t orphans = 0;
  for (bool changed = true; changed;) {
    changed = false;
    std::unordered_map<std::string, size_t> by_file;
    for (size_t i = 0; i < entries_.size(); ++i) {
      entries_[i].children = 0;
      by_file.emplace(entries_[i].file, i);
    }
    std::vector<size_t> gone;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const StoredPrefix& e = entries_[i];
      if (e.parent_file.empty()) continue;
      const auto p = by_file.find(e.parent_file);
      if (p != by_file.end() && entries_[p->second].block && entries_[p->second].state_tokens == e.parent_tokens)
        ++entries_[p->second].children;
      else
        gone.push_back(i);
    }
    for (auto i = gone.rbegin(); i != gone.rend(); ++i) drop(*i, true);  // (counts are redone above)
    orphans += gone.size();
    changed = !gone.empty();
  }
  if (orphans > 0)
    warn_(fmt::format("{}: {} entr{} whose block snapshot is gone removed", dir_, orphans, orphans == 1 ? "y" : "ies"));
  if (foreign > 0)
    warn_(fmt::format("{}: {} entr{} of another checkpoint, numerics or dsv4 build left alone", dir_, foreign,
                      foreign == 1 ? "y" : "ies"));
}

std::optional<size_t> PrefixStore::find(const std::string& file) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].file == file) return i;
  return std::nullopt;
}

void PrefixStore::drop(size_t i, bool remove_file) {
  if (remove_file) platform::remove_file(dir_ + "/" + entries_[i].file);
  bytes_ -= entries_[i].bytes;
  const std::string parent = entries_[i].parent_file;
  entries_.erase(entries_.begin() + static_cast<ptrdiff_t>(i));
  if (parent.empty()) return;
  if (auto p = find(parent); p && entries_[*p].children > 0) --entries_[*p].children;
}

void PrefixStore::remove(size_t i, const std::string& why) {
  warn_(fmt::format("{}/{}: {}; removed (the prompt is prefilled instead)", dir_, entries_[i].file, why));
  drop(i, true);
}

std::optional<SessionState> PrefixStore::load(size_t i) {
  StoredPrefix& e = entries_[i];
  const std::string path = dir_ + "/" + e.file;
  try {
    const File f = File::open_read(path);
    const uint64_t size = f.size();
    std::array<uint8_t, kHeaderBytes> b;
    if (size < kHeaderBytes) fail("truncated ({} bytes)", size);
    f.read_exact(b.data(), kHeaderBytes, 0);
    if (std::memcmp(b.data(), kMagic, 8) != 0) fail("bad magic");
    // Everything after the checksum is hashed as it is read, and compared at the end.
    FileSource in(f, 16, size);
    Header h;
    in.read(h.identity.data(), 16);
    in.read(&h.key_tokens, 8);
    in.read(&h.state_tokens, 8);
    in.read(&h.text_bytes, 8);
    in.read(&h.state_bytes, 8);
    in.read(&h.parent_tokens, 8);
    in.read(&h.flags, 8);
    const uint64_t flags = (e.block ? kBlockFlag : 0) | (e.own ? kOwnFlag : 0);
    if (h.identity != identity_ || h.key_tokens != e.key.size() || h.state_tokens != e.state_tokens ||
        h.text_bytes != e.text.size() || h.parent_tokens != e.parent_tokens || h.flags != flags ||
        kHeaderBytes + 4 * h.key_tokens + h.text_bytes + h.state_bytes != size)
      fail("its header changed since the server started");
    std::vector<int32_t> key(h.key_tokens);
    if (!key.empty()) in.read(key.data(), 4 * key.size());
    std::string text(h.text_bytes, '\0');
    if (!text.empty()) in.read(text.data(), text.size());
    if (key != e.key || text != e.text) fail("its key changed since the server started");
    SessionState s;
    std::string garbled;
    try {
      s = read_session(in);
    } catch (const Error& err) {
      garbled = err.what();  // reported as a checksum mismatch below if the bytes are corrupted
    }
    // Read whatever is left so the checksum covers the whole file.
    std::vector<uint8_t> rest(static_cast<size_t>(std::min<uint64_t>(in.remaining(), kIoChunk)));
    const bool trailing = in.remaining() > 0;
    while (in.remaining() > 0) in.read(rest.data(), static_cast<size_t>(std::min<uint64_t>(in.remaining(), rest.size())));
    if (in.digest() != get_u64(b.data() + 8)) fail("checksum mismatch (the file is corrupted)");
    if (!garbled.empty()) fail("its session does not parse: {}", garbled);
    if (trailing) fail("bytes after the session");
    if (static_cast<int64_t>(s.layers.size()) != limits_.layers) fail("{} layers, the model has {}", s.layers.size(), limits_.layers);
    if (s.mtp.streams.size() != limits_.mtp_streams || s.mtp.stream_position.size() != limits_.mtp_positions)
      fail("its MTP drafter state has {} + {} values, the engine's {} + {}", s.mtp.streams.size(),
           s.mtp.stream_position.size(), limits_.mtp_streams, limits_.mtp_positions);
    if (s.position != static_cast<int64_t>(s.tokens.size()) || s.tokens.size() != e.state_tokens ||
        !std::equal(s.tokens.begin(), s.tokens.end(), e.key.begin()))
      fail("its session does not match its key");
    for (int32_t t : e.key)
      if (t < 0 || t >= limits_.vocab_size) fail("token id {} outside the vocabulary", t);
    touch(i);
    return s;
  } catch (const Error& err) {
    if (!path_exists(path)) {  // removed by another server sharing the directory
      drop(i, false);
      return std::nullopt;
    }
    warn_(fmt::format("{}: {}; ignored and removed (the prompt is prefilled instead)", path,
                      without_path(err.what(), path)));
    drop(i, true);
    return std::nullopt;
  }
}

void PrefixStore::move_to_front(size_t i) {
  StoredPrefix used = std::move(entries_[i]);
  entries_.erase(entries_.begin() + static_cast<ptrdiff_t>(i));
  entries_.insert(entries_.begin(), std::move(used));
}

void PrefixStore::touch(size_t i) {
  // The newest mtime keeps it longest, also across restarts.
  platform::touch_file(dir_ + "/" + entries_[i].file);
  move_to_front(i);
}

PrefixStore::Stored PrefixStore::store(const SessionState& state, std::span<const int32_t> tail,
                                       const std::string& text, const StoreLinks& links) {
  std::vector<int32_t> key = state.tokens;
  key.insert(key.end(), tail.begin(), tail.end());
  const std::string name = file_name(key);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].file != name) continue;
    touch(i);
    return {name, {}};
  }
  size_t parent_tokens = 0;
  if (!links.parent_file.empty()) {
    const auto p = find(links.parent_file);
    if (!p) return {};
    const StoredPrefix& parent = entries_[*p];
    parent_tokens = parent.state_tokens;
    if (!parent.block || parent_tokens == 0 || parent_tokens >= state.tokens.size() ||
        !std::equal(parent.key.begin(), parent.key.end(), state.tokens.begin()))
      return {};
  }
  if (links.block && !tail.empty()) return {};
  const uint64_t state_bytes = serialized_session_bytes(state);
  const uint64_t size = kHeaderBytes + 4 * key.size() + text.size() + state_bytes;
  if (size > max_bytes_) return {};
  const std::string temp = fmt::format("{}/tmp-{}-{}{}", dir_, platform::process_id(), temp_counter_++, kTempSuffix);
  const std::string path = dir_ + "/" + name;
  try {
    Fd fd(platform::create_for_write(temp, true));
    if (fd.fd < 0) fail("cannot create {}: {}", temp, std::strerror(errno));
    Header h;
    h.identity = identity_;
    h.key_tokens = key.size();
    h.state_tokens = state.tokens.size();
    h.text_bytes = text.size();
    h.state_bytes = state_bytes;
    h.parent_tokens = parent_tokens;
    h.flags = (links.block ? kBlockFlag : 0) | (links.own ? kOwnFlag : 0);
    FileSink out(fd.fd, 16);
    out.write(h.identity.data(), 16);
    out.write(&h.key_tokens, 8);
    out.write(&h.state_tokens, 8);
    out.write(&h.text_bytes, 8);
    out.write(&h.state_bytes, 8);
    out.write(&h.parent_tokens, 8);
    out.write(&h.flags, 8);
    if (!key.empty()) out.write(key.data(), 4 * key.size());
    if (!text.empty()) out.write(text.data(), text.size());
    write_session(state, out);
    out.flush();
    h.checksum = out.digest();
    const auto head = encode(h);
    if (platform::pwrite(fd.fd, head.data(), 16, 0) != 16) fail("write failed: {}", std::strerror(errno));
    if (!platform::sync_data(fd.fd)) fail("fsync failed: {}", std::strerror(errno));
    platform::close_file(fd.fd);  // Windows renames only closed files
    fd.fd = -1;
    if (!platform::rename_replace(temp, path)) fail("cannot rename to {}: {}", path, std::strerror(errno));
    platform::sync_directory(dir_);  // the rename itself survives a power cut
  } catch (const Error& err) {
    platform::remove_file(temp);
    warn_(fmt::format("{}: cannot store a {}-token prefix: {}", dir_, key.size(), err.what()));
    return {};
  }
  platform::FileInfo st;
  StoredPrefix e;
  e.key = std::move(key);
  e.state_tokens = state.tokens.size();
  e.text = text;
  e.file = name;
  e.bytes = size;
  e.mtime_ns = platform::stat_path(path, &st) ? st.mtime_ns : 0;
  e.parent_file = links.parent_file;
  e.parent_tokens = parent_tokens;
  e.block = links.block;
  e.own = links.own;
  bytes_ += size;
  entries_.insert(entries_.begin(), std::move(e));
  if (parent_tokens > 0) ++entries_[*find(links.parent_file)].children;
  return {name, evict(name)};
}

std::vector<std::string> PrefixStore::evict(const std::string& keep) {
  // The least recently used entry that no other entry refers to goes first (a parent is
  // usable as soon as its last child is gone).
  std::vector<std::string> removed;
  while (bytes_ > max_bytes_) {
    size_t victim = entries_.size();
    while (victim > 0 && (entries_[victim - 1].file == keep || entries_[victim - 1].children > 0)) --victim;
    if (victim == 0) break;
    removed.push_back(entries_[victim - 1].file);
    drop(victim - 1, true);
  }
  return removed;
}

}  // namespace dsv4::server
