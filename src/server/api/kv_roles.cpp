#include "server/api/kv_roles.h"

#include "core/error.h"

namespace tessera::api {

const char* serve_role_name(ServeRole role) {
  switch (role) {
    case ServeRole::Colocated:
      return "colocated";
    case ServeRole::Prefill:
      return "prefill";
    case ServeRole::Decode:
      return "decode";
  }
  return "?";
}

ServeRole serve_role_from_name(const std::string& name) {
  for (ServeRole r : {ServeRole::Colocated, ServeRole::Prefill, ServeRole::Decode})
    if (name == serve_role_name(r)) return r;
  fail("unknown serving role '", name, "' (colocated, prefill or decode)");
}

void PulledKv::give_back() {
  if (settled_) return;
  settled_ = true;
  try {
    engine_.cancel_kv_import(import_.reservation);
  } catch (const std::exception&) {
    // The engine has stopped (shutdown): the reservation went with its pool. Called from
    // ~PulledKv too, which must not throw.
  }
}

void note_fallback(disagg::KvTransferCounters* counters, const std::function<void(const std::string&)>& log,
                   const std::string& handle, const std::string& why) {
  if (counters) counters->fallbacks.fetch_add(1);
  if (log) log("kv transfer: " + handle + ": " + why + "; prefilling locally");
}

std::shared_ptr<PulledKv> pull_kv(Engine& engine, const KvRoleOptions& options, const disagg::KvHandle& handle) {
  TESSERA_CHECK(options.puller != nullptr, "pull_kv: this server has no KV puller (not --role decode)");
  KvImportReservation reservation;
  try {
    reservation = engine.reserve_kv_import(handle.n_blocks);
  } catch (const std::exception& e) {
    note_fallback(options.counters, options.log, handle.address(), e.what());
    return nullptr;
  }
  auto pulled = std::make_shared<PulledKv>(engine, KvImport{reservation.id, nullptr});
  try {
    pulled->attach(options.puller->pull(handle, engine.kv_identity(), reservation.staging, options.pull_timeout));
    return pulled;
  } catch (const std::exception& e) {
    note_fallback(options.counters, options.log, handle.address(), e.what());
    return nullptr;  // ~PulledKv gives the reservation back
  }
}

}  // namespace tessera::api
