#include "benchharness/kv_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "model/pp/stage.h"
#include "model/tp/shard.h"
#include "engine/parallel_ranks.h"
#include "engine/session.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "model/hf_config.h"
#include "model/weights.h"

namespace tessera::bench {

namespace {

// The same mapping as the safetensors loader (loader_safetensors.cpp's config_from_hf), for
// the fields the plan needs; done here so kv-plan works on a config.json without weights.
ModelConfig config_from_hf_fields(const HFConfig& h, const std::string& dir) {
  ModelConfig c;
  c.arch = h.model_type.empty() ? h.architecture : h.model_type;
  c.name = std::filesystem::path(dir).filename().string();
  c.n_vocab = static_cast<int>(h.vocab_size);
  c.n_embd = static_cast<int>(h.hidden_size);
  c.n_layer = static_cast<int>(h.num_hidden_layers);
  c.n_head = static_cast<int>(h.num_attention_heads);
  c.n_head_kv = static_cast<int>(h.num_key_value_heads);
  c.head_dim = static_cast<int>(h.head_dim);
  c.n_ff = static_cast<int>(h.intermediate_size);
  c.n_ctx_train = static_cast<int>(h.max_position_embeddings);
  c.tied_embeddings = h.tie_word_embeddings;
  return c;
}

int n_local_layers(const ModelConfig& c) {
  int n = 0;
  for (int il = 0; il < c.n_layer; ++il) n += c.is_local_layer(il);
  return n;
}

std::string human_bytes(double b) {
  char buf[32];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) b /= 1024, ++u;
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

}  // namespace

int64_t parse_memory_size(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("'", text, "' is not a memory size (e.g. 16GiB, 512MiB, 80GB)");
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double mult = 0;
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"K", 1024.0},
                                                  {"k", 1024.0},
                                                  {"KiB", 1024.0},
                                                  {"KB", 1e3},
                                                  {"M", 1048576.0},
                                                  {"m", 1048576.0},
                                                  {"MiB", 1048576.0},
                                                  {"MB", 1e6},
                                                  {"G", 1073741824.0},
                                                  {"g", 1073741824.0},
                                                  {"GiB", 1073741824.0},
                                                  {"GB", 1e9},
                                                  {"T", 1099511627776.0},
                                                  {"TiB", 1099511627776.0},
                                                  {"TB", 1e12}};
  for (const auto& [name, m] : units)
    if (unit == name) mult = m;
  TESSERA_CHECK(mult > 0, "'", text, "' has an unknown unit '", unit, "' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  TESSERA_CHECK(v > 0 && v * mult < 9e18, "'", text, "' is not a positive memory size");
  return static_cast<int64_t>(v * mult);
}

KvModelInfo load_kv_model_info(const std::string& model) {
  KvModelInfo info;
  info.source = model;
  if (model.rfind("dummy:", 0) == 0) {
    std::string spec = model.substr(6);
    std::string dtype = "f16";
    if (const size_t colon = spec.find(':'); colon != std::string::npos) {
      dtype = spec.substr(colon + 1);
      spec = spec.substr(0, colon);
    }
    info.config = dummy_preset(spec);
    // Dummy weights exist only in memory; their size is parameters × the element size.
    double bytes_per_param = 0;
    std::string upper = dtype;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    for (uint32_t id = 0; id < 64; ++id) {
      const DType t = dtype_from_ggml_id(id);
      if (t != DType::Unknown && dtype_name(t) == upper) {
        const auto& tr = dtype_traits(t);
        bytes_per_param = static_cast<double>(tr.block_bytes) / static_cast<double>(tr.block_elems);
      }
    }
    TESSERA_CHECK(bytes_per_param > 0, "kv-plan: unknown weight type '", dtype, "' in '", model, "'");
    info.weight_bytes = static_cast<int64_t>(static_cast<double>(info.config.n_params()) * bytes_per_param);
    info.weight_bytes_estimated = true;
    return info;
  }
  const std::string path = resolve_model_path(model);
  if (std::filesystem::is_directory(path) || std::filesystem::path(path).filename() == "config.json") {
    const std::filesystem::path dir =
        std::filesystem::is_directory(path) ? std::filesystem::path(path) : std::filesystem::path(path).parent_path();
    info.config = config_from_hf_fields(load_hf_config(dir.string()), dir.string());
    int64_t bytes = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") bytes += static_cast<int64_t>(e.file_size());
    if (bytes > 0) {
      info.weight_bytes = bytes;
    } else {
      // No weight files next to config.json: estimate from the parameters and torch_dtype.
      const std::string td = load_hf_config(dir.string()).torch_dtype;
      info.weight_bytes = info.config.n_params() * (td == "float32" ? 4 : 2);
      info.weight_bytes_estimated = true;
    }
    return info;
  }
  const auto gguf = GGUFFile::open(path);
  info.config = config_from_gguf(*gguf);
  for (const auto& t : gguf->tensors()) info.weight_bytes += static_cast<int64_t>(t.n_bytes);
  return info;
}

std::vector<std::string> kv_plan_formats() {
  return {"f32",  "f16",      "fp8_e4m3", "fp8_e4m3:token", "int8",   "int8:g32",
          "int4", "int4:g32", "turbo4",   "turbo3.5",       "turbo3", "turbo2.5"};
}

double kv_bytes_per_token(const ModelConfig& c, double bytes_per_elem) {
  return 2.0 * c.n_layer * c.n_head_kv * c.head_dim * bytes_per_elem;
}

namespace {
// What one rank holds: its KV heads and layers and its share of the weights (the whole model
// at size 1); throws naming what does not split.
struct RankShare {
  int kv_heads = 0;
  int layers = 0;
  int64_t weight_bytes = 0;
};
RankShare rank_share(const KvModelInfo& m, const KvPlanOptions& o) {
  const ModelConfig& c = m.config;
  const int tp = o.tensor_parallel_size, pp = o.pipeline_parallel_size;
  TESSERA_CHECK(tp >= 1, "kv-plan: --tensor-parallel-size ", tp);
  TESSERA_CHECK(pp >= 1, "kv-plan: --pipeline-parallel-size ", pp);
  // The largest rank: tensor rank 0 of stage 0 (shards are equal; earlier stages take the
  // extra layers). Its weights: its shard of its stage's share.
  RankShare r{c.n_head_kv, c.n_layer, m.weight_bytes};
  try {
    if (tp > 1) {
      r.kv_heads = plan_tensor_parallel(c, tp).n_head_kv;
      r.weight_bytes /= tp;
    }
    if (pp > 1) {
      r.layers = plan_pipeline(c, pp).n_layers(0);
      r.weight_bytes = r.weight_bytes * r.layers / c.n_layer;
    }
  } catch (const Error& e) {
    fail("kv-plan: ", ParallelLayout{.tensor = tp, .pipeline = pp}.flag(), ": ", e.what());
  }
  return r;
}
}  // namespace

std::vector<KvPlanRow> kv_plan(const KvModelInfo& model, const KvPlanOptions& o) {
  TESSERA_CHECK(!o.ctx.empty() && !o.block_sizes.empty(), "kv-plan: no context lengths or block sizes");
  std::vector<KvPlanRow> rows;
  const ModelConfig& c = model.config;
  const RankShare share = rank_share(model, o);
  const int kv_heads = share.kv_heads, layers = share.layers;
  const int64_t budget = o.memory_bytes - share.weight_bytes - o.reserve_bytes;
  for (const std::string& name : o.formats)
    for (int bs : o.block_sizes)
      for (int64_t ctx : o.ctx) {
        TESSERA_CHECK(bs >= 1 && ctx >= 1, "kv-plan: block size ", bs, " and context ", ctx, " must be positive");
        KvCacheSpec spec = KvCacheSpec::plain(layers, kv_heads, c.head_dim, bs, 1, DType::F16);
        spec.k_format = parse_kv_format(name, true);
        spec.v_format = parse_kv_format(name, false);
        KvPlanRow r;
        r.dtype = name;
        r.supported = true;
        try {
          check_kv_format(spec.k_format, c.head_dim, bs);
          check_kv_format(spec.v_format, c.head_dim, bs);
        } catch (const Error& e) {
          r.supported = false;
          r.unsupported_why = e.what();
        }
        r.block_size = bs;
        r.ctx = ctx;
        // As the cache allocates it: pages with their scales, per block.
        r.bytes_per_token = spec.bytes_per_token();
        r.bits_per_elem = 8.0 * r.bytes_per_token / (2.0 * layers * kv_heads * c.head_dim);
        r.block_bytes = bs * r.bytes_per_token;
        r.blocks_per_seq = (ctx + bs - 1) / bs;
        r.seq_bytes = static_cast<double>(r.blocks_per_seq) * r.block_bytes;
        r.expected_waste_bytes = 0.5 * r.block_bytes;
        r.waste_fraction = r.expected_waste_bytes / (static_cast<double>(ctx) * r.bytes_per_token);
        r.kv_budget_bytes = budget;
        r.total_blocks = budget > 0 ? static_cast<int64_t>(std::floor(budget / r.block_bytes)) : 0;
        r.max_concurrency = r.total_blocks / r.blocks_per_seq;
        // Sliding windows: the full layers keep every block, the local ones about a window
        // (the engine's pool: the window before the next token and the block it writes).
        // A stage's layers are all local or none (plan_pipeline refuses window patterns).
        const int n_local = std::min(n_local_layers(c), layers);
        const double layer_block_bytes = r.block_bytes / layers;
        r.local_blocks_per_seq =
            n_local > 0 ? std::min<int64_t>(r.blocks_per_seq, (c.sliding_window - 1) / bs + 2) : r.blocks_per_seq;
        r.windowed_seq_bytes = layer_block_bytes * (static_cast<double>(r.blocks_per_seq) * (layers - n_local) +
                                                    static_cast<double>(r.local_blocks_per_seq) * n_local);
        r.windowed_max_concurrency =
            budget > 0 ? static_cast<int64_t>(std::floor(static_cast<double>(budget) / r.windowed_seq_bytes)) : 0;
        rows.push_back(r);
      }
  return rows;
}

std::string format_kv_plan(const KvModelInfo& m, const KvPlanOptions& o, const std::vector<KvPlanRow>& rows) {
  std::ostringstream os;
  const ModelConfig& c = m.config;
  os << "model: " << (c.name.empty() ? m.source : c.name) << " (" << m.source << ")\n"
     << "layers " << c.n_layer << ", KV heads " << c.n_head_kv << ", head dim " << c.head_dim << ", trained context "
     << c.n_ctx_train << "\n"
     << "weights: " << human_bytes(static_cast<double>(m.weight_bytes))
     << (m.weight_bytes_estimated ? " (estimated)" : "") << "; memory "
     << human_bytes(static_cast<double>(o.memory_bytes));
  const int tp = o.tensor_parallel_size, pp = o.pipeline_parallel_size;
  const RankShare share = rank_share(m, o);
  const bool ranks = tp > 1 || pp > 1;
  if (tp > 1 && pp > 1)
    os << " per rank of " << tp * pp << " (" << tp << " tensor-parallel ranks in each of " << pp
       << " pipeline stages), the largest holding " << share.kv_heads << " of the " << c.n_head_kv << " KV heads of "
       << share.layers << " of the " << c.n_layer << " layers and its share of the weights ("
       << human_bytes(static_cast<double>(share.weight_bytes)) << ")";
  else if (tp > 1)
    os << " per rank of " << tp << " tensor-parallel ranks, each holding 1/" << tp << " of the weights ("
       << human_bytes(static_cast<double>(share.weight_bytes)) << ") and " << share.kv_heads << " of the "
       << c.n_head_kv << " KV heads";
  else if (pp > 1)
    os << " per stage of " << pp << " pipeline stages, the largest holding " << share.layers << " of the " << c.n_layer
       << " layers and their share of the weights (" << human_bytes(static_cast<double>(share.weight_bytes)) << ")";
  if (o.reserve_bytes) os << " - reserve " << human_bytes(static_cast<double>(o.reserve_bytes));
  os << " -> KV budget " << human_bytes(static_cast<double>(o.memory_bytes - share.weight_bytes - o.reserve_bytes))
     << (ranks ? " per rank" : "") << "\n\n";
  os << "KV bytes per token" << (ranks ? " per rank" : "") << " = 2 x " << share.layers << " layers x "
     << share.kv_heads << " KV heads x " << c.head_dim << " head dim x bits per element / 8 (scales included)\n\n";
  const int n_local = n_local_layers(c);
  if (n_local > 0)
    os << "sliding window " << c.sliding_window << " on " << n_local << " of " << c.n_layer
       << " layers: in their own pool they keep one window per sequence (the last two columns; "
          "--disable-hybrid-kv-cache-manager keeps every layer's whole context)\n\n";
  os << "| KV format | fits | bits/elem | bytes/token | block | ctx | blocks/seq | KV per seq | expected waste/seq "
        "| waste % | blocks in budget | max concurrency |"
     << (n_local > 0 ? " KV per seq, windowed | max concurrency, windowed |" : "")
     << "\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" << (n_local > 0 ? "---:|---:|" : "") << "\n";
  for (const auto& r : rows) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "| %s | %s | %.2f | %.0f | %d | %lld | %lld | %s | %s | %.2f | %lld | %lld |",
                  r.dtype.c_str(), r.supported ? "yes" : "no", r.bits_per_elem, r.bytes_per_token, r.block_size,
                  static_cast<long long>(r.ctx), static_cast<long long>(r.blocks_per_seq),
                  human_bytes(r.seq_bytes).c_str(), human_bytes(r.expected_waste_bytes).c_str(), r.waste_fraction * 100,
                  static_cast<long long>(r.total_blocks), static_cast<long long>(r.max_concurrency));
    os << buf;
    if (n_local > 0) {
      std::snprintf(buf, sizeof buf, " %s | %lld |", human_bytes(r.windowed_seq_bytes).c_str(),
                    static_cast<long long>(r.windowed_max_concurrency));
      os << buf;
    }
    os << "\n";
  }
  os << "\nmax concurrency = floor(blocks in budget / ceil(ctx / block)): sequences that can each hold the full "
        "context at once.\nexpected waste: a sequence's last block is on average half empty. Formats: "
        "docs/design/kv-quant.md (int4 = KIVI: per-channel keys, whose scales shrink with larger blocks).\n";
  for (const auto& r : rows)
    if (!r.supported) {
      os << r.dtype << " does not fit this model: " << r.unsupported_why << "\n";
      break;
    }
  return os.str();
}

nlohmann::json kv_plan_json(const KvModelInfo& m, const KvPlanOptions& o, const std::vector<KvPlanRow>& rows) {
  nlohmann::json jr = nlohmann::json::array();
  for (const auto& r : rows)
    jr.push_back({{"dtype", r.dtype},
                  {"supported", r.supported},
                  {"bits_per_elem", r.bits_per_elem},
                  {"block_size", r.block_size},
                  {"ctx", r.ctx},
                  {"bytes_per_token", r.bytes_per_token},
                  {"block_bytes", r.block_bytes},
                  {"blocks_per_seq", r.blocks_per_seq},
                  {"seq_bytes", r.seq_bytes},
                  {"expected_waste_bytes", r.expected_waste_bytes},
                  {"waste_fraction", r.waste_fraction},
                  {"kv_budget_bytes", r.kv_budget_bytes},
                  {"total_blocks", r.total_blocks},
                  {"max_concurrency", r.max_concurrency},
                  {"local_blocks_per_seq", r.local_blocks_per_seq},
                  {"windowed_seq_bytes", r.windowed_seq_bytes},
                  {"windowed_max_concurrency", r.windowed_max_concurrency}});
  const ModelConfig& c = m.config;
  const RankShare share = rank_share(m, o);
  return {{"model",
           {{"source", m.source},
            {"name", c.name},
            {"n_layer", c.n_layer},
            {"n_head_kv", c.n_head_kv},
            {"head_dim", c.head_dim},
            {"n_ctx_train", c.n_ctx_train},
            {"sliding_window", c.sliding_window},
            {"n_local_layers", n_local_layers(c)},
            {"weight_bytes", m.weight_bytes},
            {"weight_bytes_estimated", m.weight_bytes_estimated}}},
          {"memory_bytes", o.memory_bytes},
          {"tensor_parallel_size", o.tensor_parallel_size},
          {"pipeline_parallel_size", o.pipeline_parallel_size},
          {"n_head_kv_per_rank", share.kv_heads},
          {"n_layer_per_rank", share.layers},
          {"reserve_bytes", o.reserve_bytes},
          {"rows", jr}};
}

}  // namespace tessera::bench
