// Prefill/decode disaggregation inside the engine core: leases on the prefill side, import
// reservations on the decode side (engine/kv_transfer.h, docs/design/disaggregation.md).
#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "engine/engine_core.h"

namespace tessera {

KvIdentity KvIdentity::of(const KvCacheSpec& spec, const std::string& model_fingerprint) {
  KvIdentity id;
  id.model_fingerprint = model_fingerprint;
  id.kv_format = spec.format_name();
  id.n_layers = spec.n_layers;
  id.n_kv_heads = spec.n_kv_heads;
  id.head_dim = spec.head_dim;
  id.block_size = spec.block_size;
  id.k_layer_block_bytes = spec.k_layer_block_bytes();
  id.v_layer_block_bytes = spec.v_layer_block_bytes();
  return id;
}

std::string KvIdentity::mismatch(const KvIdentity& o) const {
  std::ostringstream os;
  const auto differ = [&](const char* what, const auto& here, const auto& there) {
    if (here == there || !os.str().empty()) return;
    os << what << ": here '" << here << "', there '" << there << "'";
  };
  differ("model fingerprint", model_fingerprint, o.model_fingerprint);
  differ("KV format", kv_format, o.kv_format);
  differ("layers", n_layers, o.n_layers);
  differ("KV heads", n_kv_heads, o.n_kv_heads);
  differ("head dim", head_dim, o.head_dim);
  differ("block size", block_size, o.block_size);
  differ("K bytes per layer block", k_layer_block_bytes, o.k_layer_block_bytes);
  differ("V bytes per layer block", v_layer_block_bytes, o.v_layer_block_bytes);
  return os.str();
}

KvIdentity EngineCore::kv_identity() const {
  const KvCacheSpec* spec = executor_.kv_spec();
  TESSERA_CHECK(spec != nullptr, "engine: ", executor_.kv_transfer_refusal());
  return KvIdentity::of(*spec, config_.model_fingerprint);
}

std::optional<Rejection> EngineCore::validate_transfer(const Request& r) const {
  if (r.kv_lease_seconds == 0 && !r.kv_import) return std::nullopt;
  if (executor_.kv_spec() == nullptr) return invalid_request(executor_.kv_transfer_refusal());
  if (!config_.prefix_caching)
    return invalid_request("KV transfer needs prefix caching (the blocks go through the prefix index)");
  if (config_.window > 0)
    return invalid_request("KV transfer of a model with a sliding-window KV pool is not supported");
  if (!(r.kv_lease_seconds >= 0 && r.kv_lease_seconds <= 3600))
    return invalid_request("kv_lease_seconds = ", r.kv_lease_seconds, " is outside [0, 3600]");
  if (r.kv_lease_seconds > 0 && r.n != 1) return invalid_request("a KV lease needs n = 1, not ", r.n);
  if (!r.kv_import) return std::nullopt;
  if (r.prompt_logprobs >= 0)
    return invalid_request("prompt_logprobs needs the whole prompt computed here: it cannot start from imported KV");
  const KvImport& im = *r.kv_import;
  if (!im.payload) return invalid_request("KV import ", im.reservation, " carries no blocks");
  const KvBlocksPayload& p = *im.payload;
  if (const std::string why = kv_identity().mismatch(p.identity); !why.empty())
    return invalid_request("imported KV is of another model or format (", why, ")");
  const size_t bs = static_cast<size_t>(config_.block_size);
  if (p.tokens.size() % bs != 0)
    return invalid_request("imported KV holds ", p.tokens.size(), " tokens, not whole blocks of ", bs);
  // A hit must leave at least one prompt token to compute (the first token's logits).
  if (p.tokens.size() > (r.prompt.size() - 1) / bs * bs)
    return invalid_request("imported KV of ", p.tokens.size(), " tokens is longer than the prompt of ", r.prompt.size(),
                           " allows");
  if (!std::equal(p.tokens.begin(), p.tokens.end(), r.prompt.begin()))
    return invalid_request("imported KV is of other tokens than the prompt's first ", p.tokens.size());
  if (p.tenant_salt != r.tenant_salt)
    return invalid_request("imported KV belongs to another tenant (its prefix-cache salt differs)");
  if (p.adapter_id != r.adapter_id)
    return invalid_request("imported KV is of adapter '", p.adapter_id, "', the request uses '", r.adapter_id, "'");
  if (!p.blocks || p.blocks->n_slots() < p.n_blocks())
    return invalid_request("imported KV stages fewer than its ", p.n_blocks(), " blocks");
  return std::nullopt;
}

void EngineCore::import_kv(RequestId id, const Request& r, const BlockHash& root) {
  const KvImport& im = *r.kv_import;
  const auto it = reservations_.find(im.reservation);
  TESSERA_CHECK(it != reservations_.end(), "request ", id, ": KV reservation ", im.reservation,
                " is unknown (used or cancelled already)");
  SeqKv kv = std::move(it->second.first);
  reservations_.erase(it);
  const KvBlocksPayload& p = *im.payload;
  const int n = p.n_blocks();
  TESSERA_CHECK(n <= kv.n_blocks(), "request ", id, ": ", n, " imported blocks for a reservation of ", kv.n_blocks());
  kv_.truncate(kv, 0);  // fewer blocks than reserved: give the rest back first
  std::vector<BlockCopy> none;
  if (n > 0)
    TESSERA_CHECK(kv_.allocate_slots(kv, n * config_.block_size, none), "request ", id, ": KV reservation lost");
  try {
    executor_.import_blocks(kv.table.blocks, *p.blocks);
  } catch (...) {
    kv_.free(kv);
    throw;
  }
  // The blocks are now as if computed here: into the prefix index under the request's root
  // (a key another block holds already is not entered; the request hits that one instead).
  kv.root = root;
  kv.add_computed(n * config_.block_size);
  kv_.cache_full_blocks(kv, p.tokens);
  ++transfer_.imports;
  transfer_.imported_blocks += n;
  import_holds_[id] = std::move(kv);
}

void EngineCore::release_import_hold(RequestId id) {
  const auto it = import_holds_.find(id);
  if (it == import_holds_.end()) return;
  kv_.free(it->second);
  import_holds_.erase(it);
}

KvImportReservation EngineCore::reserve_import(int32_t n_blocks) {
  TESSERA_CHECK(executor_.kv_spec() != nullptr, "engine: ", executor_.kv_transfer_refusal());
  TESSERA_CHECK(config_.prefix_caching && config_.window == 0,
                "engine: KV import needs prefix caching and no sliding-window pool");
  TESSERA_CHECK(n_blocks >= 0 && n_blocks <= kv_.n_blocks(), "engine: a KV import of ", n_blocks,
                " blocks into a cache of ", kv_.n_blocks());
  SeqKv kv;
  std::vector<BlockCopy> none;
  // Free blocks the running sequences do not need for their next token stay theirs: an import
  // takes only what is left beyond one block per running sequence.
  const int spare = kv_.n_free() - static_cast<int>(scheduler_.n_running());
  TESSERA_CHECK(n_blocks <= spare && kv_.allocate_slots(kv, n_blocks * config_.block_size, none),
                "engine: no room to import ", n_blocks, " KV blocks (", kv_.n_free(), " free, ", scheduler_.n_running(),
                " running sequences)");
  KvImportReservation r;
  r.id = next_reservation_++;
  r.n_blocks = n_blocks;
  r.staging = executor_.make_staging(n_blocks);
  reservations_[r.id] = {std::move(kv), r.staging};
  return r;
}

bool EngineCore::cancel_import(uint64_t id) {
  const auto it = reservations_.find(id);
  if (it == reservations_.end()) return false;
  kv_.free(it->second.first);
  reservations_.erase(it);
  ++transfer_.imports_cancelled;
  return true;
}

void EngineCore::lease_finished(const std::vector<SeqEvent>& events, StepResult& result) {
  const auto now = std::chrono::steady_clock::now();
  for (const SeqEvent& e : events) {
    if (!e.request_done || (e.finish != FinishReason::Stop && e.finish != FinishReason::Length)) continue;
    const auto it = lease_wanted_.find(e.request);
    if (it == lease_wanted_.end()) continue;
    const LeaseWanted& w = it->second;
    // Its blocks were just freed into the prefix index and nothing has run since: the prompt's
    // leading full blocks (the ones a decode engine can use: it still computes the last token)
    // are all found, and retained by the lease.
    const int max_blocks = (static_cast<int>(w.prompt.size()) - 1) / config_.block_size;
    const std::vector<int32_t> hits = kv_.find_prefix(w.root, w.prompt, max_blocks);
    Lease lease;
    kv_.adopt_prefix(lease.kv, hits);
    lease.tokens.assign(w.prompt.begin(), w.prompt.begin() + lease.kv.n_computed());
    lease.tenant_salt = w.tenant_salt;
    lease.adapter_id = w.adapter_id;
    lease.expires =
        now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(w.seconds));
    const KvLeaseInfo info{e.request, lease.kv.n_blocks(), lease.kv.n_computed()};
    leases_[e.request] = std::move(lease);
    ++transfer_.leases_created;
    result.leases.emplace_back(e.request, info);
  }
}

std::shared_ptr<const KvBlocksPayload> EngineCore::export_lease(uint64_t id) {
  const auto it = leases_.find(id);
  TESSERA_CHECK(it != leases_.end(), "KV lease ", id, " is unknown: it expired, was released or never existed");
  const Lease& lease = it->second;
  auto p = std::make_shared<KvBlocksPayload>();
  p->identity = kv_identity();
  p->tokens = lease.tokens;
  p->tenant_salt = lease.tenant_salt;
  p->adapter_id = lease.adapter_id;
  p->blocks = executor_.make_staging(lease.kv.n_blocks());
  executor_.export_blocks(lease.kv.table.blocks, *p->blocks);
  transfer_.exported_blocks += lease.kv.n_blocks();
  return p;
}

bool EngineCore::release_lease(uint64_t id) {
  const auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  kv_.free(it->second.kv);
  leases_.erase(it);
  ++transfer_.leases_released;
  return true;
}

int EngineCore::expire_leases(std::chrono::steady_clock::time_point now) {
  int n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    kv_.free(it->second.kv);
    it = leases_.erase(it);
    ++transfer_.leases_expired;
    ++n;
  }
  return n;
}

std::optional<std::chrono::steady_clock::time_point> EngineCore::next_lease_expiry() const {
  std::optional<std::chrono::steady_clock::time_point> next;
  for (const auto& [id, lease] : leases_)
    if (!next || lease.expires < *next) next = lease.expires;
  return next;
}

}  // namespace tessera
