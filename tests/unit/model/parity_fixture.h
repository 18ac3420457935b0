#pragma once
// llama.cpp reference fixtures for whole-model parity tests: the top-k logits binary that
// tools/fixtures/make_logit_fixtures.py writes (format: tests/fixtures/llama/README.md), a
// float64 log-softmax, and the KL estimator the tests use.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera::test {

struct Position {
  float lse, next_logprob;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};
struct Record {
  std::string name, text;
  bool add_special, parse_special;
  std::vector<int32_t> tokens;
  std::vector<Position> pos;
};

template <typename T>
inline T read_pod(std::ifstream& in) {
  T v;
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  if (!in) throw std::runtime_error("fixture truncated");
  return v;
}

inline std::vector<Record> read_topk(const std::string& path, int& top_k) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  char magic[8];
  in.read(magic, 8);
  if (std::memcmp(magic, "TSLGT001", 8) != 0) throw std::runtime_error("bad magic in " + path);
  read_pod<uint32_t>(in);  // version
  const uint32_t n_records = read_pod<uint32_t>(in);
  read_pod<uint32_t>(in);  // n_vocab
  top_k = static_cast<int>(read_pod<uint32_t>(in));
  std::vector<Record> out(n_records);
  for (auto& r : out) {
    auto read_str = [&] {
      std::string s(read_pod<uint32_t>(in), '\0');
      in.read(s.data(), s.size());
      return s;
    };
    r.name = read_str();
    r.text = read_str();
    const uint32_t flags = read_pod<uint32_t>(in);
    r.add_special = flags & 1;
    r.parse_special = flags & 2;
    r.tokens.resize(read_pod<uint32_t>(in));
    in.read(reinterpret_cast<char*>(r.tokens.data()), 4 * r.tokens.size());
    r.pos.resize(r.tokens.size());
    for (auto& p : r.pos) {
      p.lse = read_pod<float>(in);
      p.next_logprob = read_pod<float>(in);
      p.top_ids.resize(top_k);
      p.top_logprobs.resize(top_k);
      in.read(reinterpret_cast<char*>(p.top_ids.data()), 4 * top_k);
      in.read(reinterpret_cast<char*>(p.top_logprobs.data()), 4 * top_k);
    }
  }
  return out;
}

inline std::vector<double> log_softmax(const float* logits, int n) {
  const float mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = std::log(sum) + mx;
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = logits[i] - lse;
  return out;
}

// KL(ref || ours) over the reference's top-k ids plus one bucket for the rest of the vocabulary
// (a lower bound of the exact KL; within a few percent of it at k = 20).
inline double topk_kl(const Position& ref, const std::vector<double>& ours) {
  double kl = 0, ref_mass = 0, our_mass = 0;
  for (size_t k = 0; k < ref.top_ids.size(); ++k) {
    const double lp = ref.top_logprobs[k];
    kl += std::exp(lp) * (lp - ours[ref.top_ids[k]]);
    ref_mass += std::exp(lp);
    our_mass += std::exp(ours[ref.top_ids[k]]);
  }
  const double ref_tail = std::max(1e-12, 1 - ref_mass), our_tail = std::max(1e-12, 1 - our_mass);
  return kl + ref_tail * std::log(ref_tail / our_tail);
}

}  // namespace tessera::test
