// The GGUF writer (format/gguf_writer.h) and `tessera quantize` on GGUF (model/quantize_gguf.h):
// a file written back is read by the reader with every key and tensor as given; a tiny Qwen3-MoE
// file (tests/fixtures/arch) requantized to Q8_0 keeps its metadata and non-matrix tensors, its
// matrices decode within Q8_0's error, and the model's logits stay close to the F32 file's.
// gguf-py read tessera's Q8_0 output independently when this was written (docs/design/weight-quant.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/model_runner.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "model/model.h"
#include "model/quantize_gguf.h"
#include "model/weights.h"
#include "quant/quant.h"
#include "quantized_model_util.h"

using namespace tessera;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tessera_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::vector<float> logits_of(const std::string& path, const std::vector<int32_t>& toks) {
  return testing_util::run_logits(load_gguf_weights(std::shared_ptr<GGUFFile>(GGUFFile::open(path))), toks);
}

}  // namespace

TEST(GgufWriter, WritesWhatTheReaderReadsBack) {
  GGUFWriter w;
  GGUFValue arr;
  arr.type = GGUFType::ARRAY;
  arr.elem_type = GGUFType::I32;
  arr.ints = {-3, 0, 7};
  GGUFValue floats;
  floats.type = GGUFType::ARRAY;
  floats.elem_type = GGUFType::F32;
  floats.floats = {0.5, -2.25};
  GGUFValue strs;
  strs.type = GGUFType::ARRAY;
  strs.elem_type = GGUFType::STRING;
  strs.strs = {"a", "", "ccc"};
  GGUFValue f64;
  f64.type = GGUFType::F64;
  f64.f = 0.125;
  GGUFValue boolean;
  boolean.type = GGUFType::BOOL;
  boolean.i = 1;
  w.set_string("general.architecture", "llama");
  w.set_u32("general.alignment", 64);
  w.set("test.ints", arr);
  w.set("test.floats", floats);
  w.set("test.strings", strs);
  w.set("test.f64", f64);
  w.set("test.bool", boolean);
  w.set_u32("test.replaced", 1);
  w.set_u32("test.replaced", 2);
  std::vector<float> a(96);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 3;
  std::vector<uint8_t> q(dtype_row_bytes(DType::Q8_0, 64) * 3);
  std::vector<float> src(64 * 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.1f * static_cast<float>(i));
  for (int r = 0; r < 3; ++r) quantize_row(DType::Q8_0, src.data() + r * 64, q.data() + r * 34 * 2, 64);
  w.add_tensor("a.weight", DType::F32, {32, 3}, a.data(), a.size() * 4);
  w.add_tensor("b.weight", DType::Q8_0, {64, 3}, q.data(), q.size());
  EXPECT_THROW(w.add_tensor("c", DType::Q8_0, {48}, q.data(), 34), Error);  // not whole blocks
  EXPECT_THROW(w.add_tensor("d", DType::F32, {4}, a.data(), 12), Error);    // wrong byte count
  const std::string path = temp_path("writer.gguf");
  w.write(path);
  {
    const auto f = GGUFFile::open(path);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(*f->get_string("general.architecture"), "llama");
    EXPECT_EQ(f->get_int_array("test.ints"), (std::vector<int64_t>{-3, 0, 7}));
    EXPECT_EQ(f->get_float_array("test.floats"), (std::vector<double>{0.5, -2.25}));
    EXPECT_EQ(f->get_string_array("test.strings"), (std::vector<std::string_view>{"a", "", "ccc"}));
    EXPECT_EQ(*f->get_float("test.f64"), 0.125);
    EXPECT_EQ(*f->get_bool("test.bool"), true);
    EXPECT_EQ(*f->get_int("test.replaced"), 2);
    ASSERT_EQ(f->tensors().size(), 2u);
    const GGUFTensorInfo* ta = f->find_tensor("a.weight");
    const GGUFTensorInfo* tb = f->find_tensor("b.weight");
    ASSERT_TRUE(ta && tb);
    EXPECT_EQ(ta->shape, (std::vector<int64_t>{32, 3}));
    EXPECT_EQ(0, std::memcmp(ta->data, a.data(), a.size() * 4));
    EXPECT_EQ(tb->dtype, DType::Q8_0);
    EXPECT_EQ(0, std::memcmp(tb->data, q.data(), q.size()));
    EXPECT_EQ(tb->offset % 64, 0u);
  }
  std::filesystem::remove(path);
}

TEST(QuantizeGguf, RequantizesMatricesAndKeepsTheRest) {
  const std::string in = std::string(TESSERA_FIXTURES_DIR) + "/arch/qwen3moe.gguf";
  const std::string out = temp_path("q8.gguf");
  const GgufQuantizeReport r = quantize_gguf(in, out, gguf_quant_target("q8_0"), nullptr);
  const auto src = GGUFFile::open(in);
  const auto dst = GGUFFile::open(out);
  EXPECT_EQ(*dst->get_int("general.file_type"), 7);  // LLAMA_FTYPE_MOSTLY_Q8_0
  for (const auto& [key, value] : src->metadata())
    if (key != "general.file_type") {
      EXPECT_TRUE(dst->has(key)) << key;
    }
  ASSERT_EQ(dst->tensors().size(), src->tensors().size());
  int requantized = 0;
  for (const GGUFTensorInfo& s : src->tensors()) {
    const GGUFTensorInfo* d = dst->find_tensor(s.name);
    ASSERT_TRUE(d) << s.name;
    EXPECT_EQ(d->shape, s.shape) << s.name;
    const bool matrix = s.shape.size() >= 2 && s.name.find("ffn_gate_inp") == std::string::npos;
    EXPECT_EQ(d->dtype, matrix ? DType::Q8_0 : s.dtype) << s.name;
    if (!matrix) {
      EXPECT_EQ(0, std::memcmp(d->data, s.data, s.n_bytes)) << s.name;
      continue;
    }
    ++requantized;
    const int64_t n = s.n_elements();
    std::vector<float> a(n), b(n);
    dequantize_row(s.dtype, s.data, a.data(), n);
    dequantize_row(DType::Q8_0, d->data, b.data(), n);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) err += (double(b[i]) - a[i]) * (double(b[i]) - a[i]), norm += double(a[i]) * a[i];
    EXPECT_LT(std::sqrt(err / norm), 0.01) << s.name;  // Q8_0: about 0.5 % on these N(0, s) weights
  }
  EXPECT_EQ(requantized, 16);  // embeddings, output, per layer q/k/v/o and the three expert stacks
  EXPECT_EQ(r.tensors.size(), src->tensors().size());
  EXPECT_LT(r.bytes_out, r.bytes_in);
  const std::vector<int32_t> toks = {1, 17, 200, 36, 5, 5, 9, 121};
  const auto ref = logits_of(in, toks), got = logits_of(out, toks);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
  std::printf("[quantize] qwen3moe q8_0 logits rel err %.4f against f32\n", std::sqrt(num / den));
  EXPECT_LT(std::sqrt(num / den), 0.05);
  std::filesystem::remove(out);
  EXPECT_THROW(gguf_quant_target("f16"), Error);  // not a GGUF target type
}

// The _M mix against a real file: gemma-3-270m-q4_k_m.gguf (18 layers, width 640 = 2.5 blocks of
// 256) as llama-quantize wrote it has ffn_down in Q6_K at layers 0, 1, 4, 7, 10, 13, 15, 16, 17
// and Q4_K elsewhere; attn_v (640 wide) Q8_0 at the same layers and Q5_0 elsewhere (the K types'
// fallbacks); token_embd (tied: the output) Q8_0; attn_q/k, ffn_gate/up Q5_0; attn_output Q4_K.
TEST(QuantizeGguf, KMixPicksTheTypesLlamaQuantizeDid) {
  const GgufQuantTarget m = gguf_quant_target("q4_k_m");
  const std::vector<int64_t> wide = {2048, 640}, narrow = {640, 1024};
  auto type = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return gguf_tensor_target(m, name, shape, DType::F16, 18, /*has_output=*/false);
  };
  for (int i = 0; i < 18; ++i) {
    const bool more = i == 0 || i == 1 || i == 4 || i == 7 || i == 10 || i == 13 || i >= 15;
    const std::string p = "blk." + std::to_string(i) + ".";
    EXPECT_EQ(type(p + "ffn_down.weight", wide), more ? DType::Q6_K : DType::Q4_K) << i;
    EXPECT_EQ(type(p + "attn_v.weight", narrow), more ? DType::Q8_0 : DType::Q5_0) << i;
    EXPECT_EQ(type(p + "attn_q.weight", narrow), DType::Q5_0) << i;
    EXPECT_EQ(type(p + "attn_output.weight", {1024, 640}), DType::Q4_K) << i;
    EXPECT_EQ(type(p + "attn_norm.weight", {640}), DType::F16) << i;
  }
  EXPECT_EQ(type("token_embd.weight", {640, 262144}), DType::Q8_0);  // tied: treated as the output
  EXPECT_EQ(gguf_tensor_target(m, "token_embd.weight", {2048, 1000}, DType::F16, 18, true), DType::Q4_K);
  EXPECT_EQ(gguf_tensor_target(m, "output.weight", {2048, 1000}, DType::F16, 18, true), DType::Q6_K);
  EXPECT_EQ(gguf_tensor_target(m, "blk.3.ffn_gate_inp.weight", {2048, 8}, DType::F32, 18, true), DType::F32);
  EXPECT_EQ(gguf_quant_target("q4_k_m").llama_ftype, 15u);
  EXPECT_THROW(gguf_quant_target("q3_k_m"), Error);
}
