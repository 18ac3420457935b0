#include "apps/common.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tessera::apps {

void ModelArgs::add_to(CLI::App& cmd) {
  cmd.add_option("-m,--model", model, "GGUF path, alias (smollm2-135m) or dummy:<preset>[:dtype]")
      ->capture_default_str();
  cmd.add_option("--device", device, "cpu or cuda")->capture_default_str();
  cmd.add_option("-t,--threads", threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd.add_option("-c,--ctx", ctx, "context tokens to provision (0 = min(trained, 4096))")->capture_default_str();
  cmd.add_option("-b,--batch", batch, "tokens per forward (prefill chunk)")->capture_default_str();
  cmd.add_option("--block-size", block_size, "tokens per KV block")->capture_default_str();
  cmd.add_option("--kv-type", kv_type, "KV cache type: f16 or f32")->capture_default_str();
}

SessionOptions ModelArgs::session_options() const {
  SessionOptions o;
  o.model = model;
  o.backend.device = device;
  o.backend.threads = threads;
  o.ctx = ctx;
  o.max_batch_tokens = batch;
  o.block_size = block_size;
  if (kv_type == "f16") o.kv_dtype = DType::F16;
  else if (kv_type == "f32") o.kv_dtype = DType::F32;
  else fail("--kv-type '", kv_type, "' is not one of f16, f32");
  o.dummy_seed = seed;
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tessera::apps
