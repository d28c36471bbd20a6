// A read-mostly open-addressing hash map from string views to token ids. The keys are views into
// storage the owner keeps alive (the tokenizer's spelling table); one flat array keeps lookups
// and the 128k-entry build cheap, which is most of what loading a tokenizer.json costs.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace dsv4::text {

class FlatStringMap {
 public:
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < n * 2) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    size_ = 0;
  }

  // Inserts key → value; returns false (and changes nothing) if the key is already present.
  bool insert(std::string_view key, int32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    return place(key, value, hash(key));
  }

  // The value of `key`, or -1.
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value < 0) return -1;
      if (s.hash == h && s.key == key) return s.value;
    }
  }

  size_t size() const { return size_; }

 private:
  struct Slot {
    std::string_view key;
    uint64_t hash = 0;
    int32_t value = -1;  // -1 = empty
  };

  static uint64_t hash(std::string_view key) {
    // FNV-1a over 8-byte words with a final avalanche: fast for the short keys of a vocabulary.
    uint64_t h = 0xcbf29ce484222325ull ^ key.size();
    size_t i = 0;
    for (; i + 8 <= key.size(); i += 8) {
      uint64_t w = 0;
      for (int b = 0; b < 8; ++b) w |= static_cast<uint64_t>(static_cast<uint8_t>(key[i + static_cast<size_t>(b)])) << (8 * b);
      h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < key.size(); ++i) h = (h ^ static_cast<uint8_t>(key[i])) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
  }

  bool place(std::string_view key, int32_t value, uint64_t h) {
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.value < 0) {
        s = {key, h, value};
        ++size_;
        return true;
      }
      if (s.hash == h && s.key == key) return false;
    }
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reserve(old.empty() ? 8 : old.size());
    for (const Slot& s : old)
      if (s.value >= 0) place(s.key, s.value, s.hash);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace dsv4::text

namespace dsv4::text {

// Open-addressing map from a 64-bit key (a packed token pair) to a small value: the BPE merge
// table, probed for every adjacent pair of every new word.
template <typename Value>
class FlatPairMap {
 public:
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < n * 2) capacity *= 2;
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, Value{});
    mask_ = capacity - 1;
    size_ = 0;
  }

  // Inserts or overwrites.
  void put(uint64_t key, const Value& value) {
    if ((size_ + 1) * 2 > keys_.size()) grow();
    for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = value;
        ++size_;
        return;
      }
      if (keys_[i] == key) {
        values_[i] = value;
        return;
      }
    }
  }

  const Value* find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // (-1, -1) is never a pair of token ids

  static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
  }

  void grow() {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<Value> values = std::move(values_);
    reserve(keys.empty() ? 8 : keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmpty) put(keys[i], values[i]);
  }

  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace dsv4::text
