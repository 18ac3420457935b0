#include "server/api/kv_transfer_params.h"

#include <limits>

#include "server/api/api_error.h"

namespace tessera::api {

namespace {
constexpr size_t kMaxHandleBytes = 512;  // host (a DNS name is at most 253) + port + id
}  // namespace

std::optional<KvTransferParams> parse_kv_transfer_params(const json& body) {
  const Fields top(body);
  const json* object = top.get("kv_transfer_params");
  if (object == nullptr) return std::nullopt;
  if (!object->is_object())
    invalid_param("kv_transfer_params", "invalid_type", "kv_transfer_params must be an object, not ",
                  json_type_name(*object));
  const Fields f(*object, "kv_transfer_params.");
  KvTransferParams p;
  p.do_remote_decode = f.boolean("do_remote_decode").value_or(false);
  p.do_remote_prefill = f.boolean("do_remote_prefill").value_or(false);
  const std::optional<std::string> address = f.string("remote_handle", kMaxHandleBytes);
  const std::optional<int64_t> n_blocks = f.integer("remote_block_count", 0, std::numeric_limits<int32_t>::max());
  if (!address) {
    if (n_blocks && *n_blocks > 0)
      invalid_param(f.name("remote_handle"), "missing_required_parameter", "kv_transfer_params.remote_block_count is ",
                    *n_blocks, " but remote_handle is missing");
    return p;
  }
  if (!p.do_remote_prefill)
    invalid_param(f.name("do_remote_prefill"), "invalid_value",
                  "kv_transfer_params.remote_handle needs do_remote_prefill = true");
  if (!n_blocks)
    invalid_param(f.name("remote_block_count"), "missing_required_parameter",
                  "kv_transfer_params.remote_handle needs remote_block_count (the blocks under the lease)");
  try {
    p.handle = disagg::KvHandle::parse(*address, static_cast<int32_t>(*n_blocks));
  } catch (const Error& e) {
    invalid_param(f.name("remote_handle"), "invalid_value", "kv_transfer_params.remote_handle: ", e.what());
  }
  return p;
}

ojson kv_transfer_params_json(const std::optional<disagg::KvHandle>& handle) {
  ojson j;
  j["do_remote_decode"] = false;
  j["do_remote_prefill"] = true;
  j["remote_handle"] = handle ? ojson(handle->address()) : ojson(nullptr);
  j["remote_block_count"] = handle ? handle->n_blocks : 0;
  return j;
}

}  // namespace tessera::api
