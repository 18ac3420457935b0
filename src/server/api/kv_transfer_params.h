#pragma once
// vLLM's `kv_transfer_params` request and response field for prefill/decode disaggregation
// (docs/design/disaggregation.md, "The serving roles"). The router sends a prefill worker
// {"do_remote_decode": true, ...}; the prefill worker answers with where its KV lease can be
// pulled from; the router hands that object, as it came, to a decode worker:
//
//   {"do_remote_decode": false, "do_remote_prefill": true,
//    "remote_handle": "10.0.0.5:7100/42", "remote_block_count": 6}
//
// vLLM's NIXL connector names blocks and engine ids instead (remote_block_ids,
// remote_engine_id); tessera's handle is a lease: host:port of the prefill worker's KV
// server and the lease id, with the block count the decode worker reserves.
#include <cstdint>
#include <optional>
#include <string>

#include "disagg/kv_transport.h"
#include "server/api/json_fields.h"
#include "server/api/response_json.h"

namespace tessera::api {

struct KvTransferParams {
  bool do_remote_decode = false;   // to a prefill worker: keep the KV for a decode worker
  bool do_remote_prefill = false;  // to a decode worker: the prompt was prefilled elsewhere
  // With do_remote_prefill: where to pull the KV from. None: prefill locally (the prefill
  // worker had no full block to lease).
  std::optional<disagg::KvHandle> handle;
};

// body["kv_transfer_params"]; nullopt when absent or null. A wrong type, a handle that is not
// host:port/id, or a handle without remote_block_count is a 400 naming the field
// ("kv_transfer_params.remote_handle").
std::optional<KvTransferParams> parse_kv_transfer_params(const json& body);

// The prefill worker's answer (the object above); `handle` none: remote_handle null.
ojson kv_transfer_params_json(const std::optional<disagg::KvHandle>& handle);

}  // namespace tessera::api
