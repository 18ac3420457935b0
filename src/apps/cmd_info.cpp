// tessera info: what a model file holds and what it needs.
#include <cstdio>
#include <filesystem>
#include <map>

#include "apps/commands.h"
#include "apps/common.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

namespace {

void print_config(const ModelConfig& c) {
  std::printf("architecture      %s\n", c.arch.c_str());
  std::printf("name              %s\n", c.name.c_str());
  std::printf("layers            %d\n", c.n_layer);
  std::printf("width             %d\n", c.n_embd);
  std::printf("heads             %d query, %d KV (head dim %d)\n", c.n_head, c.n_head_kv, c.head_dim);
  std::printf("ffn width         %d\n", c.n_ff);
  std::printf("vocabulary        %d\n", c.n_vocab);
  std::printf("trained context   %d\n", c.n_ctx_train);
  std::printf("rope              base %g, dim %d, %s%s%s\n", c.rope_freq_base, c.rope_dim,
              c.rope_neox ? "neox" : "interleaved", c.rope_scaling.empty() ? "" : ", scaling ", c.rope_scaling.c_str());
  std::printf("rms eps           %g\n", c.rms_eps);
  std::printf("tied embeddings   %s\n", c.tied_embeddings ? "yes" : "no");
  if (c.n_expert > 0)
    std::printf("experts           %d, %d per token (%s)\n", c.n_expert, c.n_expert_used,
                c.moe_renormalize ? "weights renormalized" : "softmax weights as they are");
  std::printf("parameters        %.1f M (%.1f M active per token)\n", c.n_params() / 1e6, c.n_active_params() / 1e6);
  const double kv_f16 = 2.0 * c.n_layer * c.n_head_kv * c.head_dim * 2;
  std::printf("KV per token      %.0f bytes (f16), %.1f MiB per 1k tokens\n", kv_f16, kv_f16 * 1024 / (1 << 20));
}

}  // namespace

void add_info(CLI::App& app) {
  auto model = std::make_shared<std::string>("smollm2-135m");
  CLI::App* cmd = app.add_subcommand("info", "describe a model: architecture, tensors by type, memory");
  cmd->add_option("-m,--model", *model, "GGUF path, alias, Hugging Face directory or dummy:<preset>")
      ->capture_default_str();
  cmd->callback([model] {
    if (model->rfind("dummy:", 0) == 0) {
      const ModelConfig c = dummy_preset(model->substr(6, model->find(':', 6) - 6));
      print_config(c);
      return;
    }
    if (std::filesystem::is_directory(*model)) {  // a Hugging Face checkpoint
      auto weights = load_safetensors_weights(*model);
      std::printf("directory         %s (Hugging Face: config.json + safetensors)\n", model->c_str());
      print_config(weights->config);
      std::printf("weight memory     %.2f MiB (memory-mapped where stored in a computable type)\n",
                  weights->weight_bytes / 1048576.0);
      return;
    }
    const std::string path = resolve_model_path(*model);
    auto gguf = std::shared_ptr<GGUFFile>(GGUFFile::open(path));
    auto weights = load_gguf_weights(gguf);
    std::printf("file              %s (GGUF v%u, %zu tensors, %zu metadata keys)\n", path.c_str(), gguf->version(),
                gguf->tensors().size(), gguf->metadata().size());
    print_config(weights->config);
    std::map<std::string, std::pair<int, uint64_t>> by_type;
    for (const auto& t : gguf->tensors()) {
      auto& e = by_type[std::string(dtype_name(t.dtype))];
      e.first += 1;
      e.second += t.n_bytes;
    }
    std::printf("tensors by type\n");
    for (const auto& [name, e] : by_type)
      std::printf("  %-6s %4d tensors  %9.2f MiB\n", name.c_str(), e.first, e.second / 1048576.0);
    std::printf("weight memory     %.2f MiB (memory-mapped)\n", weights->weight_bytes / 1048576.0);
    auto tok = Tokenizer::from_gguf(*gguf);
    std::printf("tokenizer         %d tokens, bos %d, eos %d, chat template %s\n", tok->vocab_size(), tok->bos_id(),
                tok->eos_id(), tok->chat_template().empty() ? "none" : "present");
  });
}

}  // namespace tessera::apps
