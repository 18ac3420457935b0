#include "engine/simulator.h"

#include <chrono>
#include <thread>

#include "core/error.h"

namespace tessera {

namespace {
constexpr uint64_t kChainStart = 0x7e55e7a5eedULL;

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t chain(uint64_t prev, int32_t token, int32_t pos) {
  return mix(prev ^ mix(static_cast<uint64_t>(static_cast<uint32_t>(token)) << 32 | static_cast<uint32_t>(pos)));
}
}  // namespace

double CostModel::step_seconds(const ForwardBatch& b) const {
  double context = 0;
  for (int s = 0; s < b.n_seqs(); ++s) context += b.kv_len[s];
  return step_overhead_s + per_token_s * b.n_tokens() + per_seq_s * b.n_seqs() + per_context_token_s * context;
}

SimulatedExecutor::SimulatedExecutor(const SimulatorConfig& config) : config_(config) {
  TESSERA_CHECK(config.n_blocks >= 1 && config.block_size >= 1, "simulator: KV layout of ", config.n_blocks,
                " blocks of ", config.block_size, " tokens");
  TESSERA_CHECK(config.vocab_size >= 2, "simulator: vocabulary of ", config.vocab_size, " tokens");
  const size_t slots = static_cast<size_t>(config.n_blocks) * config.block_size;
  kv_.assign(slots, 0);
  written_.assign(slots, 0);
  TESSERA_CHECK(config.window >= 0 && (config.window > 0) == (config.n_local_blocks > 0), "simulator: window ",
                config.window, " with a local pool of ", config.n_local_blocks, " blocks");
  local_kv_.assign(static_cast<size_t>(config.n_local_blocks) * config.block_size, 0);
  local_written_.assign(local_kv_.size(), 0);
  TESSERA_CHECK(config.n_host_blocks >= 0, "simulator: host tier of ", config.n_host_blocks, " blocks");
  host_kv_.assign(static_cast<size_t>(config.n_host_blocks) * config.block_size, 0);
  host_written_.assign(host_kv_.size(), 0);
}

void SimulatedExecutor::add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t>) {
  TESSERA_CHECK(!seqs_.count(seq), "simulator: sequence ", seq, " added twice");
  seqs_[seq] = SeqState{sampling_seed(params, seq), params.n_logprobs};
}

void SimulatedExecutor::check_swap(const BlockSwap& s) const {
  const int n = s.local ? config_.n_local_blocks : config_.n_blocks;
  TESSERA_CHECK(s.device >= 0 && s.device < n && s.host >= 0 && s.host < config_.n_host_blocks,
                "simulator: bad swap of ", s.local ? "local " : "", "block ", s.device, " <-> host slot ", s.host);
}

void SimulatedExecutor::swap_out(std::span<const BlockSwap> swaps) {
  const int bs = config_.block_size;
  for (const BlockSwap& s : swaps) {
    check_swap(s);
    for (int i = 0; i < bs; ++i) {
      host_kv_[s.host * bs + i] = values(s.local)[s.device * bs + i];
      host_written_[s.host * bs + i] = written(s.local)[s.device * bs + i];
    }
  }
  n_swapped_out_ += static_cast<int64_t>(swaps.size());
}

void SimulatedExecutor::swap_in(std::span<const BlockSwap> swaps) {
  const int bs = config_.block_size;
  for (const BlockSwap& s : swaps) {
    check_swap(s);
    for (int i = 0; i < bs; ++i) {
      values(s.local)[s.device * bs + i] = host_kv_[s.host * bs + i];
      written(s.local)[s.device * bs + i] = host_written_[s.host * bs + i];
      host_written_[s.host * bs + i] = 0;  // a slot read before it is written again is an error
    }
  }
  n_swapped_in_ += static_cast<int64_t>(swaps.size());
}

Logprobs SimulatedExecutor::fake_logprobs(uint64_t value, int32_t token, int32_t n_top) const {
  const auto lp = [&](int32_t t) {
    return -static_cast<double>(mix(value ^ mix(static_cast<uint64_t>(t) + 17)) % 100000) / 1000.0;
  };
  Logprobs out;
  out.chosen = {token, lp(token)};
  for (int32_t j = 0; j < n_top; ++j) {
    const auto t =
        static_cast<int32_t>(mix(value + static_cast<uint64_t>(j)) % static_cast<uint64_t>(config_.vocab_size));
    out.top.push_back({t, lp(t)});
  }
  return out;
}

uint64_t SimulatedExecutor::sampling_seed(const SamplingParams& params, SeqId seq) {
  return params.greedy() ? 0 : mix(params.seed.value_or(seq) + 1);
}

void SimulatedExecutor::remove_sequence(SeqId seq) {
  TESSERA_CHECK(seqs_.erase(seq) == 1, "simulator: removing unknown sequence ", seq);
}

int32_t SimulatedExecutor::token_after(uint64_t value, uint64_t seed) const {
  const uint64_t h = mix(value ^ seed);
  if (config_.eos_token >= 0 && config_.eos_one_in > 0 && mix(h) % config_.eos_one_in == 0) return config_.eos_token;
  int32_t t = static_cast<int32_t>((h >> 11) % static_cast<uint64_t>(config_.vocab_size));
  if (t == config_.eos_token) t = (t + 1) % config_.vocab_size;
  return t;
}

uint64_t SimulatedExecutor::context_value(std::span<const int32_t> tokens) {
  uint64_t v = kChainStart;
  for (size_t i = 0; i < tokens.size(); ++i) v = chain(v, tokens[i], static_cast<int32_t>(i));
  return v;
}

void SimulatedExecutor::execute(const StepInput& in, StepOutput& out) {
  const ForwardBatch& b = in.batch;
  const int bs = config_.block_size;
  const int n_slots = static_cast<int>(kv_.size());
  TESSERA_CHECK(b.n_tokens() <= config_.max_batch_tokens, "simulator: batch of ", b.n_tokens(), " tokens over ",
                config_.max_batch_tokens);
  for (const BlockCopy& c : in.copies) {
    const int n = c.local ? config_.n_local_blocks : config_.n_blocks;
    TESSERA_CHECK(c.src >= 0 && c.src < n && c.dst >= 0 && c.dst < n && c.src != c.dst, "simulator: bad ",
                  c.local ? "local " : "", "block copy ", c.src, " -> ", c.dst);
    auto& v = values(c.local);
    auto& w = written(c.local);
    for (int i = 0; i < bs; ++i) {
      v[c.dst * bs + i] = v[c.src * bs + i];
      w[c.dst * bs + i] = w[c.src * bs + i];
    }
  }
  TESSERA_CHECK(b.has_local == (config_.window > 0), "simulator: a batch ", b.has_local ? "with" : "without",
                " local tables for a KV layout ", config_.window > 0 ? "with" : "without", " a local pool");
  TESSERA_CHECK(static_cast<int>(b.q_start.size()) == b.n_seqs() + 1 && b.q_start.front() == 0 &&
                    b.q_start.back() == b.n_tokens(),
                "simulator: query ranges do not cover the batch");
  for (int s = 0; s < b.n_seqs(); ++s) {
    const int32_t* table = b.block_tables.data() + static_cast<size_t>(s) * b.max_blocks;
    const int rows = b.q_start[s + 1] - b.q_start[s];
    TESSERA_CHECK(rows >= 1 && b.kv_len[s] >= rows && (b.kv_len[s] + bs - 1) / bs <= b.max_blocks,
                  "simulator: sequence ", s, " has ", rows, " rows for KV length ", b.kv_len[s]);
    const auto slot = [&](int32_t pos) {
      const int32_t block = table[pos / bs];
      TESSERA_CHECK(block >= 0 && block < config_.n_blocks, "simulator: block ", block, " out of range");
      return block * bs + pos % bs;
    };
    const int32_t* local_table =
        b.has_local ? b.local_block_tables.data() + static_cast<size_t>(s) * b.max_blocks : nullptr;
    const auto local_slot = [&](int32_t pos) {
      const int32_t block = local_table[pos / bs];
      TESSERA_CHECK(block >= 0 && block < config_.n_local_blocks, "simulator: local block ", block, " (position ", pos,
                    ") out of range or dropped");
      return block * bs + pos % bs;
    };
    for (int r = b.q_start[s]; r < b.q_start[s + 1]; ++r) {
      const int32_t pos = b.kv_len[s] - rows + (r - b.q_start[s]);
      TESSERA_CHECK(b.positions[r] == pos, "simulator: row ", r, " at position ", b.positions[r], ", expected ", pos);
      TESSERA_CHECK(b.slot_mapping[r] == slot(pos) && slot(pos) < n_slots, "simulator: row ", r, " writes slot ",
                    b.slot_mapping[r], " but its block table says ", slot(pos));
      uint64_t prev = kChainStart;
      if (pos > 0) {
        const int32_t ps = slot(pos - 1);
        TESSERA_CHECK(written_[ps], "simulator: position ", pos - 1, " (slot ", ps, ") read before any write");
        prev = kv_[ps];
      }
      kv_[b.slot_mapping[r]] = chain(prev, b.tokens[r], pos);
      written_[b.slot_mapping[r]] = 1;
      if (!b.has_local) continue;
      // The local layers read their window's oldest key and the previous position through
      // their own table: the values must be the full table's.
      for (const int32_t key : {std::max(0, pos - config_.window + 1), pos - 1}) {
        if (key < 0 || key >= pos) continue;
        const int32_t ls = local_slot(key);
        TESSERA_CHECK(local_written_[ls] && local_kv_[ls] == kv_[slot(key)],
                      "simulator: the local table reads position ", key, " (slot ", ls,
                      ") as something else than the full table");
      }
      TESSERA_CHECK(b.local_slot_mapping[r] == local_slot(pos), "simulator: row ", r, " writes local slot ",
                    b.local_slot_mapping[r], " but its local table says ", local_slot(pos));
      local_kv_[b.local_slot_mapping[r]] = kv_[b.slot_mapping[r]];
      local_written_[b.local_slot_mapping[r]] = 1;
    }
  }
  TESSERA_CHECK(static_cast<int>(b.logits_rows.size()) <= config_.max_logits_rows, "simulator: ", b.logits_rows.size(),
                " logits rows over ", config_.max_logits_rows);
  const auto row_value = [&](int32_t row) {
    TESSERA_CHECK(row >= 0 && row < static_cast<int>(b.logits_rows.size()), "simulator: logits row ", row, " of ",
                  b.logits_rows.size());
    return kv_[b.slot_mapping[b.logits_rows[row]]];
  };
  out.prompt_logprobs.clear();
  for (const PromptLogprobTarget& t : in.prompt_logprobs)
    out.prompt_logprobs.push_back(fake_logprobs(row_value(t.row), t.token, t.n_top));
  out.logprobs.clear();
  out.tokens.clear();
  out.counts.assign(in.samples.size(), 1);
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const SampleTarget& t = in.samples[i];
    const auto it = seqs_.find(t.seq);
    TESSERA_CHECK(it != seqs_.end(), "simulator: sampling unknown sequence ", t.seq);
    // Speculative targets verify like greedy decoding: the simulated model's token after
    // each position is deterministic, a draft token is kept iff it equals it, and the first
    // other one replaces it (so outputs match a run without drafts exactly).
    for (size_t j = 0; j <= t.draft.size(); ++j) {
      const uint64_t value = row_value(t.row + static_cast<int32_t>(j));
      out.tokens.push_back(token_after(value, it->second.seed));
      if (t.logprobs) out.logprobs.push_back(fake_logprobs(value, out.tokens.back(), it->second.n_logprobs));
      if (j == t.draft.size() || out.tokens.back() != t.draft[j]) {
        out.counts[i] = static_cast<int32_t>(j + 1);
        break;
      }
    }
  }
  const double dt = config_.cost.step_seconds(b);
  elapsed_s_ += dt;
  ++n_steps_;
  if (config_.sleep) std::this_thread::sleep_for(std::chrono::duration<double>(dt));
}

}  // namespace tessera
