// kv-plan against the formula: SmolLM2 from its GGUF metadata, Llama-3.1-8B from the dummy
// preset (128 KiB per token in bf16), a config.json directory, and the concurrency arithmetic.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "benchharness/kv_plan.h"
#include "core/error.h"
#include "format/gguf.h"

namespace tessera::bench {
namespace {

std::string smollm2_path() {
  const char* cache = std::getenv("TESSERA_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = cache && *cache ? cache : std::string(home ? home : ".") + "/.cache/tessera/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

const KvPlanRow& row(const std::vector<KvPlanRow>& rows, const std::string& dtype, int bs, int64_t ctx) {
  for (const auto& r : rows)
    if (r.dtype == dtype && r.block_size == bs && r.ctx == ctx) return r;
  throw std::runtime_error("no row " + dtype);
}

TEST(BenchKvPlan, ATensorParallelRankHoldsItsKvHeadsAndItsPartOfTheWeights) {
  // Llama-3.1-8B at TP 4: 2 of the 8 KV heads a rank (32 KiB per token in f16), a quarter of
  // the weights on each 80 GiB device; at TP 16 a rank keeps one KV head (two ranks share it).
  const KvModelInfo m = load_kv_model_info("dummy:llama-3.1-8b");
  KvPlanOptions o;
  o.memory_bytes = int64_t{80} << 30;
  o.ctx = {8192};
  o.formats = {"f16"};
  o.tensor_parallel_size = 4;
  const KvPlanRow tp4 = kv_plan(m, o).at(0);
  EXPECT_EQ(tp4.bytes_per_token, 131072.0 / 4);
  const int64_t budget = (int64_t{80} << 30) - m.weight_bytes / 4;
  EXPECT_EQ(tp4.kv_budget_bytes, budget);
  EXPECT_EQ(tp4.total_blocks, budget / (16 * 32768));
  EXPECT_DOUBLE_EQ(tp4.bits_per_elem, 16.0);
  const std::string text = format_kv_plan(m, o, {tp4});
  EXPECT_NE(text.find("per rank of 4 tensor-parallel ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("2 KV heads x"), std::string::npos) << text;
  o.tensor_parallel_size = 16;
  EXPECT_EQ(kv_plan(m, o).at(0).bytes_per_token, 131072.0 / 8);
  o.tensor_parallel_size = 3;
  try {
    kv_plan(m, o);
    ADD_FAILURE() << "TP 3 of 32 heads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-parallel-size 3: tensor parallel: 32 attention heads do not split"),
              std::string::npos)
        << e.what();
  }
}

TEST(BenchKvPlan, APipelineStageHoldsItsLayersAndTheirShareOfTheWeights) {
  // Llama-3.1-8B at PP 3: 32 layers as 11 | 11 | 10; the largest stage holds 11 layers' KV
  // (11 x 4 KiB a token in f16) and 11/32 of the weights.
  const KvModelInfo m = load_kv_model_info("dummy:llama-3.1-8b");
  KvPlanOptions o;
  o.memory_bytes = int64_t{80} << 30;
  o.ctx = {8192};
  o.formats = {"f16"};
  o.pipeline_parallel_size = 3;
  const KvPlanRow pp3 = kv_plan(m, o).at(0);
  EXPECT_EQ(pp3.bytes_per_token, 131072.0 * 11 / 32);
  EXPECT_EQ(pp3.kv_budget_bytes, (int64_t{80} << 30) - m.weight_bytes * 11 / 32);
  EXPECT_DOUBLE_EQ(pp3.bits_per_elem, 16.0);
  const std::string text = format_kv_plan(m, o, {pp3});
  EXPECT_NE(text.find("per stage of 3 pipeline stages, the largest holding 11 of the 32 layers"), std::string::npos)
      << text;
  o.pipeline_parallel_size = 33;
  EXPECT_THROW(kv_plan(m, o), Error);
}

TEST(BenchKvPlan, WithBothTheLargestRankHoldsItsHeadsOfTheFirstStagesLayers) {
  // Llama-3.1-8B at TP 2 x PP 3: 11 | 11 | 10 layers, 4 of the 8 KV heads a rank; its weights
  // half of the largest stage's share.
  const KvModelInfo m = load_kv_model_info("dummy:llama-3.1-8b");
  KvPlanOptions o;
  o.memory_bytes = int64_t{80} << 30;
  o.ctx = {8192};
  o.formats = {"f16"};
  o.tensor_parallel_size = 2;
  o.pipeline_parallel_size = 3;
  const KvPlanRow row = kv_plan(m, o).at(0);
  EXPECT_EQ(row.bytes_per_token, 131072.0 * 11 / 32 / 2);
  EXPECT_EQ(row.kv_budget_bytes, (int64_t{80} << 30) - m.weight_bytes / 2 * 11 / 32);
  const std::string text = format_kv_plan(m, o, {row});
  EXPECT_NE(text.find("per rank of 6 (2 tensor-parallel ranks in each of 3 pipeline stages), the largest holding 4 of "
                      "the 8 KV heads of 11 of the 32 layers"),
            std::string::npos)
      << text;
  o.tensor_parallel_size = 3;  // 32 heads do not split over 3
  try {
    kv_plan(m, o);
    ADD_FAILURE() << "TP 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-parallel-size 3 --pipeline-parallel-size 3"), std::string::npos)
        << e.what();
  }
}

TEST(BenchKvPlan, Llama31_8B_Is128KiBPerTokenInF16) {
  const KvModelInfo m = load_kv_model_info("dummy:llama-3.1-8b");
  EXPECT_EQ(kv_bytes_per_token(m.config, 2), 131072.0);  // 2 x 32 x 8 x 128 x 2
  EXPECT_EQ(kv_bytes_per_token(m.config, 1), 65536.0);
  KvPlanOptions o;
  o.memory_bytes = int64_t{80} << 30;
  o.ctx = {8192};
  o.block_sizes = {16, 32};
  const auto rows = kv_plan(m, o);
  EXPECT_EQ(rows.size(), kv_plan_formats().size() * 2u * 1u);
  const KvPlanRow& bf16 = row(rows, "f16", 16, 8192);
  EXPECT_EQ(bf16.bytes_per_token, 131072.0);
  EXPECT_EQ(bf16.blocks_per_seq, 512);
  EXPECT_EQ(bf16.block_bytes, 16 * 131072.0);
  // Weights: f16 dummy = parameters x 2 bytes.
  EXPECT_EQ(m.weight_bytes, m.config.n_params() * 2);
  const int64_t budget = (int64_t{80} << 30) - m.weight_bytes;
  EXPECT_EQ(bf16.kv_budget_bytes, budget);
  EXPECT_EQ(bf16.total_blocks, budget / (16 * 131072));
  EXPECT_EQ(bf16.max_concurrency, (budget / (16 * 131072)) / 512);
  EXPECT_DOUBLE_EQ(bf16.expected_waste_bytes, 8 * 131072.0);
  EXPECT_DOUBLE_EQ(bf16.waste_fraction, 8.0 / 8192.0);
  // Scales count, as the cache allocates them: int4:g32 pages hold [32 tokens x 64 bytes] of
  // codes and (f16 scale, f16 min) per token per 4 groups: 2048 + 512 bytes per 32 tokens.
  EXPECT_EQ(row(rows, "int4:g32", 32, 8192).bytes_per_token, 2.0 * 32 * 8 * (2048 + 512) / 32);
  EXPECT_DOUBLE_EQ(row(rows, "int4:g32", 32, 8192).bits_per_elem, 5.0);
  // KIVI keys: (scale, min) per channel per page: 4 + 32/32 bits at block 32, 4 + 32/16 at
  // block 16; values (per token, groups of 32) 5.
  EXPECT_DOUBLE_EQ(row(rows, "int4", 32, 8192).bits_per_elem, 5.0);
  EXPECT_DOUBLE_EQ(row(rows, "int4", 16, 8192).bits_per_elem, 5.5);
  EXPECT_DOUBLE_EQ(row(rows, "fp8_e4m3", 16, 8192).bytes_per_token, 65536.0);
  EXPECT_EQ(row(rows, "f32", 32, 8192).blocks_per_seq, 256);
  EXPECT_TRUE(row(rows, "turbo3.5", 16, 8192).supported);
  EXPECT_LT(row(rows, "turbo3.5", 16, 8192).bits_per_elem, 4.0);
}

TEST(BenchKvPlan, SmolLM2FromItsGguf) {
  const std::string path = smollm2_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  const KvModelInfo m = load_kv_model_info(path);
  // The formula from the file's own metadata, read here independently of the loader.
  const auto f = GGUFFile::open(path);
  const int64_t layers = *f->get_int("llama.block_count");
  const int64_t kv_heads = *f->get_int("llama.attention.head_count_kv");
  const int64_t head_dim = *f->get_int("llama.embedding_length") / *f->get_int("llama.attention.head_count");
  EXPECT_EQ(layers * kv_heads * head_dim, 30 * 3 * 64);
  KvPlanOptions o;
  o.memory_bytes = int64_t{1} << 30;
  o.ctx = {2048, 8192};
  o.block_sizes = {16};
  const auto rows = kv_plan(m, o);
  const KvPlanRow& f16 = row(rows, "f16", 16, 2048);
  EXPECT_EQ(f16.bytes_per_token, 2.0 * layers * kv_heads * head_dim * 2);
  EXPECT_EQ(f16.bytes_per_token, 23040.0);
  int64_t tensor_bytes = 0;
  for (const auto& t : f->tensors()) tensor_bytes += static_cast<int64_t>(t.n_bytes);
  EXPECT_EQ(m.weight_bytes, tensor_bytes);
  EXPECT_FALSE(m.weight_bytes_estimated);
  const int64_t budget = (int64_t{1} << 30) - tensor_bytes;
  EXPECT_EQ(f16.max_concurrency, (budget / (16 * 23040)) / 128);
  EXPECT_EQ(row(rows, "f16", 16, 8192).max_concurrency, (budget / (16 * 23040)) / 512);
  EXPECT_NE(format_kv_plan(m, o, rows).find("| f16 | yes | 16.00 | 23040 | 16 | 2048 |"), std::string::npos);
}

TEST(BenchKvPlan, HuggingFaceConfigDirectory) {
  const std::string dir = ::testing::TempDir() + "/kvplan_hf";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
      "vocab_size": 1000, "torch_dtype": "bfloat16"})";
  const KvModelInfo m = load_kv_model_info(dir);
  EXPECT_EQ(m.config.head_dim, 64);
  EXPECT_EQ(kv_bytes_per_token(m.config, 2), 2.0 * 16 * 8 * 64 * 2);
  EXPECT_TRUE(m.weight_bytes_estimated);
  EXPECT_EQ(m.weight_bytes, m.config.n_params() * 2);
  std::filesystem::remove_all(dir);
}

// Gemma 3 270M's shape: 18 layers of one KV head x 256, window 512 on 15 of them. At 16k
// tokens a sequence's global layers keep 1024 blocks of 16, its local ones 33 (511 / 16 + 2).
TEST(BenchKvPlan, SlidingWindowLayersKeepOneWindowPerSequence) {
  const KvModelInfo m = load_kv_model_info("dummy:gemma3-270m");
  KvPlanOptions o;
  o.memory_bytes = int64_t{8} << 30;
  o.ctx = {16384, 256};
  o.formats = {"f16"};
  const auto rows = kv_plan(m, o);
  const KvPlanRow& r = row(rows, "f16", 16, 16384);
  const double layer_block = 16 * 2.0 * 256 * 2;  // one layer's K and V of a block: 16 KiB
  EXPECT_EQ(r.block_bytes, 18 * layer_block);
  EXPECT_EQ(r.local_blocks_per_seq, 33);
  EXPECT_EQ(r.windowed_seq_bytes, layer_block * (1024 * 3 + 33 * 15));
  const int64_t budget = (int64_t{8} << 30) - m.weight_bytes;
  EXPECT_EQ(r.max_concurrency, budget / static_cast<int64_t>(18 * layer_block) / 1024);
  EXPECT_EQ(r.windowed_max_concurrency, static_cast<int64_t>(budget / r.windowed_seq_bytes));
  EXPECT_GT(r.windowed_max_concurrency, 4 * r.max_concurrency);
  // A context shorter than the window saves nothing.
  const KvPlanRow& short_ctx = row(rows, "f16", 16, 256);
  EXPECT_EQ(short_ctx.local_blocks_per_seq, 16);
  EXPECT_EQ(short_ctx.windowed_seq_bytes, short_ctx.seq_bytes);
  const std::string text = format_kv_plan(m, o, rows);
  EXPECT_NE(text.find("sliding window 512 on 15 of 18 layers"), std::string::npos) << text;
  EXPECT_NE(text.find("max concurrency, windowed |"), std::string::npos) << text;
  // A model without local layers: the same figures, no extra columns.
  const KvModelInfo llama = load_kv_model_info("dummy:llama-3.1-8b");
  const auto plain = kv_plan(llama, o);
  EXPECT_EQ(row(plain, "f16", 16, 16384).windowed_max_concurrency, row(plain, "f16", 16, 16384).max_concurrency);
  EXPECT_EQ(format_kv_plan(llama, o, plain).find("windowed"), std::string::npos);
}

TEST(BenchKvPlan, MemorySizesAndBudgetsTooSmall) {
  EXPECT_EQ(parse_memory_size("16GiB"), int64_t{16} << 30);
  EXPECT_EQ(parse_memory_size("16G"), int64_t{16} << 30);
  EXPECT_EQ(parse_memory_size("80GB"), int64_t{80} * 1000 * 1000 * 1000);
  EXPECT_EQ(parse_memory_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1.5 GiB"), int64_t{3} << 29);
  EXPECT_EQ(parse_memory_size("4096"), 4096);
  EXPECT_THROW(parse_memory_size("16 parsecs"), Error);
  EXPECT_THROW(parse_memory_size("lots"), Error);
  EXPECT_THROW(parse_memory_size("-1G"), Error);
  const KvModelInfo m = load_kv_model_info("dummy:llama-3.1-8b");
  KvPlanOptions o;
  o.memory_bytes = int64_t{8} << 30;  // less than the 16 GB of f16 weights
  for (const auto& r : kv_plan(m, o)) EXPECT_EQ(r.max_concurrency, 0);
  EXPECT_THROW(load_kv_model_info("dummy:llama-9b"), Error);
}

}  // namespace
}  // namespace tessera::bench
