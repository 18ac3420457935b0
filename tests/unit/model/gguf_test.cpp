#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "model/gguf.h"

using namespace tessera;

namespace {

std::string default_model_path() {
  const char* cache = std::getenv("TESSERA_CACHE");
  std::string dir = cache ? cache : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/tessera/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace

TEST(GGUFRealModel, OpensWithExpectedMetadataAndTensors) {
  const std::string path = default_model_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  auto f = GGUFFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->metadata().size(), 33u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f->get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_NO_THROW(validate_tokenizer_metadata(*f));

  ASSERT_EQ(f->tensors().size(), 272u);
  const GGUFTensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::Q8_0);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->offset, 0u);
  EXPECT_EQ(emb->n_bytes, 30081024u);
  const GGUFTensorInfo* down = f->find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->dtype, DType::Q4_1);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{1536, 576}));
  EXPECT_EQ(down->n_bytes, 552960u);
  EXPECT_EQ(down->data - emb->data, 31868992 - 1785664);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied to token_embd
}
