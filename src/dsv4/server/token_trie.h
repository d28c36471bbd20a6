// A radix tree over token sequences, the prefix cache's index: each key is a path from the root,
// edges hold runs of tokens, and a lookup walks a prompt once, however many keys there are
// (a linear scan compared every key with the prompt). Values are pointers the caller owns; the
// same key may hold several.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace dsv4::server {

template <typename T>
class TokenTrie {
 public:
  void insert(std::span<const int32_t> key, T* value) {
    Node* n = &root_;
    size_t i = 0;
    while (i < key.size()) {
      auto it = n->children.find(key[i]);
      if (it == n->children.end()) {
        auto leaf = std::make_unique<Node>();
        leaf->edge.assign(key.begin() + static_cast<ptrdiff_t>(i), key.end());
        leaf->values.push_back(value);
        n->children.emplace(key[i], std::move(leaf));
        return;
      }
      Node* c = it->second.get();
      const size_t m = common(c->edge, key.subspan(i));
      if (m < c->edge.size()) {  // the key leaves this edge part way: split it there
        auto mid = std::make_unique<Node>();
        mid->edge.assign(c->edge.begin(), c->edge.begin() + static_cast<ptrdiff_t>(m));
        c->edge.erase(c->edge.begin(), c->edge.begin() + static_cast<ptrdiff_t>(m));
        mid->children.emplace(c->edge.front(), std::move(it->second));
        it->second = std::move(mid);
        c = it->second.get();
      }
      n = c;
      i += m;
    }
    n->values.push_back(value);
  }

  // Removes `value` from `key` (nothing if it is not there); nodes left empty go, and a node
  // left with one child and no value is merged into it.
  void erase(std::span<const int32_t> key, T* value) {
    std::vector<Node*> path{&root_};
    size_t i = 0;
    while (i < key.size()) {
      auto it = path.back()->children.find(key[i]);
      if (it == path.back()->children.end()) return;
      Node* c = it->second.get();
      if (common(c->edge, key.subspan(i)) < c->edge.size()) return;
      i += c->edge.size();
      path.push_back(c);
    }
    auto& values = path.back()->values;
    auto v = std::find(values.begin(), values.end(), value);
    if (v == values.end()) return;
    values.erase(v);
    for (size_t d = path.size() - 1; d > 0; --d) {
      Node* n = path[d];
      Node* parent = path[d - 1];
      if (!n->values.empty()) break;
      if (n->children.empty()) {
        parent->children.erase(n->edge.front());
        continue;  // the parent may be empty now
      }
      if (n->children.size() == 1) {  // merge the only child into this node
        std::unique_ptr<Node> only = std::move(n->children.begin()->second);
        n->children = std::move(only->children);
        n->values = std::move(only->values);
        n->edge.insert(n->edge.end(), only->edge.begin(), only->edge.end());
      }
      break;
    }
  }

  // Calls f(depth, value) for every value whose key is a prefix of `seq`, shortest keys first.
  template <typename F>
  void prefixes_of(std::span<const int32_t> seq, F&& f) const {
    const Node* n = &root_;
    size_t i = 0;
    for (;;) {
      for (T* v : n->values) f(i, v);
      if (i == seq.size()) return;
      auto it = n->children.find(seq[i]);
      if (it == n->children.end()) return;
      const Node* c = it->second.get();
      if (common(c->edge, seq.subspan(i)) < c->edge.size()) return;
      i += c->edge.size();
      n = c;
    }
  }

  // The most tokens any key has in common with the start of `seq`.
  size_t shared_prefix(std::span<const int32_t> seq) const {
    const Node* n = &root_;
    size_t i = 0;
    while (i < seq.size()) {
      auto it = n->children.find(seq[i]);
      if (it == n->children.end()) break;
      const Node* c = it->second.get();
      const size_t m = common(c->edge, seq.subspan(i));
      i += m;
      if (m < c->edge.size()) break;
      n = c;
    }
    return i;
  }

  void clear() { root_ = Node(); }

 private:
  struct Node {
    std::vector<int32_t> edge;  // the tokens from the parent to here (empty at the root)
    std::map<int32_t, std::unique_ptr<Node>> children;  // by the first token of their edge
    std::vector<T*> values;                             // keys that end here
  };
  static size_t common(const std::vector<int32_t>& edge, std::span<const int32_t> rest) {
    const size_t n = std::min(edge.size(), rest.size());
    return static_cast<size_t>(std::mismatch(edge.begin(), edge.begin() + static_cast<ptrdiff_t>(n), rest.begin()).first -
                               edge.begin());
  }
  Node root_;
};

}  // namespace dsv4::server
