#pragma once
// A speculative draft tree as parent indices (spec/drafter.h, Draft::parents): node j follows
// node parents[j], -1 being the sequence's last verified token (the root), parents[j] < j.
// The drafter, the engine, the scheduler and the forward batch read trees through these.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// Each node's depth: 1 for a child of the root.
inline std::vector<int> draft_tree_depths(std::span<const int16_t> parents) {
  std::vector<int> depth(parents.size());
  for (size_t j = 0; j < parents.size(); ++j)
    depth[j] = parents[j] < 0 ? 1 : depth[static_cast<size_t>(parents[j])] + 1;
  return depth;
}

// The most nodes on one root-to-leaf path (0 for no nodes).
inline int draft_tree_depth(std::span<const int16_t> parents) {
  const std::vector<int> depth = draft_tree_depths(parents);
  return depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
}

// Whether the nodes follow each other in order (a chain written as a tree).
inline bool is_draft_chain(std::span<const int16_t> parents) {
  for (size_t j = 0; j < parents.size(); ++j)
    if (parents[j] != static_cast<int>(j) - 1) return false;
  return true;
}

// The first child of `parent` (-1: the root) holding `token`, or -1.
inline int draft_tree_child(std::span<const int32_t> tokens, std::span<const int16_t> parents, int parent,
                            int32_t token) {
  for (size_t i = 0; i < parents.size(); ++i)
    if (parents[i] == parent && tokens[i] == token) return static_cast<int>(i);
  return -1;
}

}  // namespace tessera
