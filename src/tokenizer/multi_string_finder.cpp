// Aho-Corasick over a sparse trie: which special tokens occur in a text, in one linear pass.
#include <algorithm>
#include <climits>

#include "tokenizer/tokenizer_impl.h"

namespace tessera {

int32_t MultiStringFinder::child(int32_t node, uint8_t byte) const {
  const auto& next = nodes_[node].next;
  auto it = std::lower_bound(next.begin(), next.end(), byte,
                             [](const std::pair<uint8_t, int32_t>& e, uint8_t b) { return e.first < b; });
  return (it != next.end() && it->first == byte) ? it->second : -1;
}

void MultiStringFinder::build(const std::vector<std::string_view>& needles) {
  nodes_.assign(1, Node{});
  for (size_t i = 0; i < needles.size(); ++i) {
    int32_t node = 0;
    for (unsigned char b : needles[i]) {
      int32_t c = child(node, b);
      if (c < 0) {
        c = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        auto& next = nodes_[node].next;
        next.insert(std::upper_bound(next.begin(), next.end(), std::make_pair(b, INT32_MIN)), {b, c});
      }
      node = c;
    }
    if (node != 0 && nodes_[node].needle < 0) nodes_[node].needle = static_cast<int32_t>(i);
  }
  // Breadth-first: fail links, and dictionary links to the nearest needle-ending suffix.
  std::vector<int32_t> queue{0};
  for (size_t qi = 0; qi < queue.size(); ++qi) {
    const int32_t node = queue[qi];
    for (const auto& [byte, c] : nodes_[node].next) {
      int32_t f = nodes_[node].fail;
      int32_t target = 0;
      if (node != 0) {
        while (true) {
          const int32_t t = child(f, byte);
          if (t >= 0) {
            target = t;
            break;
          }
          if (f == 0) break;
          f = nodes_[f].fail;
        }
      }
      nodes_[c].fail = target;
      nodes_[c].dict = nodes_[target].needle >= 0 ? target : nodes_[target].dict;
      queue.push_back(c);
    }
  }
}

std::vector<bool> MultiStringFinder::present(std::string_view text) const {
  std::vector<bool> seen(nodes_.size() > 1 ? nodes_.size() : 1, false);  // per node, needle seen
  std::vector<bool> out;
  size_t n_needles = 0;
  for (const auto& n : nodes_) n_needles = std::max<size_t>(n_needles, n.needle + 1);
  out.assign(n_needles, false);
  if (nodes_.size() <= 1) return out;
  int32_t node = 0;
  for (unsigned char b : text) {
    while (true) {
      const int32_t c = child(node, b);
      if (c >= 0) {
        node = c;
        break;
      }
      if (node == 0) break;
      node = nodes_[node].fail;
    }
    // Report this node's needle and its dictionary chain; a chain already reported stops the
    // walk, which keeps the scan linear (each needle is reported once).
    for (int32_t m = nodes_[node].needle >= 0 ? node : nodes_[node].dict; m >= 0; m = nodes_[m].dict) {
      if (seen[m]) break;
      seen[m] = true;
      out[nodes_[m].needle] = true;
    }
  }
  return out;
}

int MultiStringFinder::longest_at(std::string_view text, size_t pos) const {
  int best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size() && !nodes_.empty(); ++i) {
    node = child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (nodes_[node].needle >= 0) best = nodes_[node].needle;
  }
  return best;
}

}  // namespace tessera
