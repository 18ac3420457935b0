#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "model/hf_config.h"
#include "format/safetensors.h"

using namespace tessera;

namespace {

// header length, header, data bytes (a recognizable pattern)
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<uint8_t>(i * 3 + 5);
  return out;
}

void expect_rejected(const std::vector<uint8_t>& bytes, std::string_view needle) {
  // An exact-size copy so that AddressSanitizer catches reads past the end.
  const std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(bytes.size(), 1)]);
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());  // data() of an empty vector may be null
  try {
    SafetensorsFile::parse(copy.get(), bytes.size(), "bad.safetensors");
    ADD_FAILURE() << "accepted a file that should fail with '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    EXPECT_EQ(msg.rfind("bad.safetensors: ", 0), 0u) << msg;
  }
}

// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-st-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::ofstream(path_ / name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path_ / name) << text; }

 private:
  std::filesystem::path path_;
};

const std::string kValidHeader = R"({"__metadata__":{"format":"pt"},)"
                                 R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                 R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]},)"
                                 R"("s":{"dtype":"F16","shape":[],"data_offsets":[30,32]},)"
                                 R"("e":{"dtype":"F32","shape":[0,4],"data_offsets":[32,32]}})";

}  // namespace

TEST(Safetensors, ValidFileRoundTrips) {
  const auto bytes = make_file(kValidHeader, 32);
  auto f = SafetensorsFile::parse(bytes.data(), bytes.size(), "ok.safetensors");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors()[0].name, "w");  // data order
  const SafetensorsTensor& w = f->tensor("w");
  EXPECT_EQ(w.dtype, DType::F32);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.n_elements(), 6);
  EXPECT_EQ(w.n_bytes, 24u);
  const size_t data_start = 8 + kValidHeader.size();
  EXPECT_EQ(w.data, bytes.data() + data_start);
  const SafetensorsTensor& b = f->tensor("b");
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_EQ(b.data[0], static_cast<uint8_t>(24 * 3 + 5));
  const SafetensorsTensor& s = f->tensor("s");  // a scalar
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.n_elements(), 1);
  EXPECT_EQ(s.n_bytes, 2u);
  EXPECT_EQ(f->tensor("e").n_bytes, 0u);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  EXPECT_THROW(f->tensor("nope"), Error);
}

TEST(Safetensors, ReadsFileWrittenBySafetensorsPy) {
  auto f = SafetensorsFile::open(std::string(TESSERA_FIXTURES_DIR) + "/model/tiny.safetensors");
  EXPECT_EQ(f->metadata().at("note"), "tiny fixture");
  ASSERT_EQ(f->tensors().size(), 4u);
  const SafetensorsTensor& emb = f->tensor("model.embed_tokens.weight");
  EXPECT_EQ(emb.shape, (std::vector<int64_t>{4, 3}));
  for (int i = 0; i < 12; ++i) {
    float v;
    std::memcpy(&v, emb.data + 4 * i, 4);
    EXPECT_EQ(v, 0.25f * i);
  }
  const SafetensorsTensor& norm = f->tensor("model.norm.weight");
  EXPECT_EQ(norm.dtype, DType::F16);
  uint16_t h;
  std::memcpy(&h, norm.data + 4, 2);
  EXPECT_EQ(fp16_to_f32(h), -3.0f);
  // Known but not computable: readable through find_tensor, refused through tensor().
  const SafetensorsTensor* pos = f->find_tensor("position_ids");
  ASSERT_NE(pos, nullptr);
  EXPECT_EQ(pos->stored, SafetensorsDType::I64);
  EXPECT_FALSE(pos->supported());
  EXPECT_EQ(pos->n_bytes, 48u);
  try {
    f->tensor("position_ids");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "tiny.safetensors: tensor 'position_ids' has dtype I64, which tessera cannot compute with"),
              std::string::npos)
        << e.what();
  }
}

TEST(Safetensors, RejectsEveryTruncation) {
  const auto bytes = make_file(kValidHeader, 32);
  for (size_t n = 0; n < bytes.size(); ++n) {
    SCOPED_TRACE(n);
    expect_rejected(std::vector<uint8_t>(bytes.begin(), bytes.begin() + n), "");
  }
}

TEST(Safetensors, RejectsBadHeaderLength) {
  auto bytes = make_file(kValidHeader, 32);
  const uint64_t too_long = bytes.size() - 8 + 1;
  std::memcpy(bytes.data(), &too_long, 8);
  expect_rejected(bytes, "header length " + std::to_string(too_long) + " runs past end of file");
  const uint64_t huge = ~uint64_t{0};
  std::memcpy(bytes.data(), &huge, 8);
  expect_rejected(bytes, "runs past end of file");
  expect_rejected({1, 2, 3}, "too short for the 8-byte header length");
  // Over 100 MB though inside the file: the buffer is never touched past the length.
  const size_t big = 100'000'016;
  std::unique_ptr<uint8_t[]> mem(new uint8_t[big]);
  const uint64_t len = big - 8;
  std::memcpy(mem.get(), &len, 8);
  try {
    SafetensorsFile::parse(mem.get(), big, "big.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is over the limit of 100000000"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RejectsBadJson) {
  expect_rejected(make_file(R"({"w":{"dtype":"F32",)", 0), "invalid JSON");
  expect_rejected(make_file("[1,2]", 0), "header is not a JSON object");
  expect_rejected(make_file(std::string(100, '[') + std::string(100, ']'), 0), "nested deeper than 16");
  expect_rejected(make_file(R"({"__metadata__":{"a":1}})", 0), "'__metadata__' entry 'a' is number");
  expect_rejected(make_file(R"({"w":[]})", 0), "tensor 'w': entry is array");
  expect_rejected(make_file(R"({"w":{"shape":[],"data_offsets":[0,4]}})", 4),
                  "tensor 'w': missing or non-string 'dtype'");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), "missing or non-array 'shape'");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[]}})", 4), "'data_offsets' must be an array");
  expect_rejected(make_file(R"({"":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4), "empty name");
}

TEST(Safetensors, RejectsDuplicateNames) {
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                            8),
                  "duplicate key 'w'");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", 4),
                  "duplicate key 'dtype'");
}

TEST(Safetensors, RejectsBadOffsets) {
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 8),
                  "tensor 'w': data offsets [4, 0) are reversed");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8),
                  "tensor 'w': data [4, 12) runs past the end of the data (8 bytes)");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", 8),
                  "runs past the end of the data");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 8),
                  "data offset begin -4 is negative");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", 8),
                  "data offset end is 4.0, expected a non-negative integer");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8),
                  "'data_offsets' must be an array of two integers");
}

TEST(Safetensors, RejectsUnknownDtypeAndSizeMismatch) {
  expect_rejected(make_file(R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", 4),
                  "tensor 'w': unknown dtype 'F7'");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
                  "tensor 'w': data [0, 20) holds 20 bytes but shape [2,3] of F32 needs 24");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                  "dimension 0 -2 is negative");
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                  "overflows 64 bits");
  expect_rejected(make_file(R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", 8),
                  "overflows 64 bits");  // 2^61 elements * 8 bytes = 2^64
  expect_rejected(make_file(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
                  "9 dimensions");
}

TEST(Safetensors, RejectsOverlap) {
  expect_rejected(make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                            16),
                  "tensor 'b': data at offset 8 overlaps tensor 'a' [0, 16)");
  expect_rejected(make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                            R"("b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                            16),
                  "overlaps");
}

TEST(SafetensorsModel, OpensSingleFileDirectory) {
  TempDir dir;
  dir.write("model.safetensors", make_file(kValidHeader, 32));
  for (const std::string& p : {dir.path().string(), (dir.path() / "model.safetensors").string()}) {
    auto m = SafetensorsModel::open(p);
    EXPECT_EQ(m->shards().size(), 1u);
    EXPECT_EQ(m->tensors().size(), 4u);
    EXPECT_EQ(m->tensor("w").shape, (std::vector<int64_t>{2, 3}));
  }
  TempDir empty;
  EXPECT_THROW(SafetensorsModel::open(empty.path().string()), Error);
}

TEST(SafetensorsModel, OpensShardedDirectory) {
  TempDir dir;
  dir.write("model-00001-of-00002.safetensors",
            make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  dir.write("model-00002-of-00002.safetensors", make_file(R"({"b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
                                                          R"("c":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})",
                                                          16));
  dir.write("model.safetensors.index.json", std::string(R"({"metadata":{"total_size":24},"weight_map":{)"
                                                        R"("a":"model-00001-of-00002.safetensors",)"
                                                        R"("b":"model-00002-of-00002.safetensors",)"
                                                        R"("c":"model-00002-of-00002.safetensors"}})"));
  auto m = SafetensorsModel::open(dir.path().string());
  EXPECT_EQ(m->shards().size(), 2u);
  EXPECT_EQ(m->tensors().size(), 3u);
  EXPECT_EQ(m->tensor("a").dtype, DType::F32);
  EXPECT_EQ(m->tensor("b").dtype, DType::BF16);
  ASSERT_NE(m->find_tensor("c"), nullptr);
  try {
    m->tensor("c");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors: tensor 'c' has dtype I64"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(m->find_tensor("d"), nullptr);
}

TEST(SafetensorsModel, RejectsInconsistentIndexes) {
  const auto expect_msg = [](const TempDir& dir, const std::string& index, std::string_view needle) {
    dir.write("model.safetensors.index.json", index);
    try {
      SafetensorsModel::open(dir.path().string());
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TempDir dir;
  dir.write("s1.safetensors", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  dir.write("s2.safetensors", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                        16));
  expect_msg(dir, R"({"weight_map":{"a":"s1.safetensors","b":"s3.safetensors"}})", "s3.safetensors");
  expect_msg(dir, R"({"weight_map":{"a":"../s1.safetensors"}})", "is not a plain file name");
  expect_msg(dir, R"({"weight_map":{"x":"s1.safetensors"}})",
             "tensor 'x' is mapped to 's1.safetensors', which does not contain it");
  // 'a' is in both shards; the index can place it in only one.
  expect_msg(dir, R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})",
             "s2.safetensors: tensor 'a' is listed in");
  expect_msg(dir, R"({"weight_map":{"b":"s2.safetensors"}})", "tensor 'a' is not listed");
  expect_msg(dir, R"({"weight_map":{}})", "lists no tensors");
  expect_msg(dir, R"({"weight_map":{"a":1}})", "'weight_map' entry 'a' is not a string");
  expect_msg(dir, R"({"weight_map":{"a":"s1.safetensors","a":"s1.safetensors"}})", "duplicate key 'a'");
  expect_msg(dir, R"({"metadata":{}})", "missing or non-object 'weight_map'");
  expect_msg(dir, R"({"weight_map":)", "invalid JSON");
}

// ---------------------------------------------------------------------------------------
// config.json, the other half of a safetensors model directory (model/hf_config.h).

namespace {
std::string fixture(const std::string& name) { return std::string(TESSERA_FIXTURES_DIR) + "/model/" + name; }

void expect_config_error(const std::string& text, std::string_view needle) {
  try {
    parse_hf_config(text, "cfg.json");
    ADD_FAILURE() << "accepted; expected " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("cfg.json: ", 0), 0u) << e.what();
  }
}

// The smallest config that parses, with `extra` fields added to it.
std::string minimal_config(const std::string& extra = "") {
  return R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,)"
         R"("num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100)" +
         (extra.empty() ? "" : "," + extra) + "}";
}
}  // namespace

TEST(HFConfig, ReadsSmolLM2) {
  const HFConfig c = load_hf_config(fixture("config_smollm2_135m.json"));
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 100000.0);  // written as an integer
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_FALSE(c.rope_scaling.has_value());  // null
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(HFConfig, ReadsLlama31RopeScalingAndEosList) {
  const HFConfig c = load_hf_config(fixture("config_llama31_8b.json"));
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HFConfig, ReadsQwen2WithImplicitQkvBias) {
  TempDir dir;  // load_hf_config also takes the model directory
  std::ifstream in(fixture("config_qwen25_05b.json"));
  dir.write("config.json", std::string(std::istreambuf_iterator<char>(in), {}));
  const HFConfig c = load_hf_config(dir.path().string());
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
}

// Qwen3-0.6B's config.json: head_dim 128 over hidden 1024 / 16 heads, no bias, the window off.
TEST(HFConfig, ReadsQwen3WithExplicitHeadDimAndTheWindowOff) {
  const HFConfig c = load_hf_config(fixture("config_qwen3_06b.json"));
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 0);  // null
  EXPECT_FALSE(c.use_sliding_window);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 40960);
}

// Mistral-7B-v0.1's config.json: a 4096-key sliding window on every layer.
TEST(HFConfig, ReadsMistralSlidingWindow) {
  const HFConfig c = load_hf_config(fixture("config_mistral_7b_v01.json"));
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_TRUE(c.use_sliding_window);
  const HFConfig q = load_hf_config(fixture("config_qwen25_05b.json"));
  EXPECT_EQ(q.sliding_window, 32768);  // present but switched off
  EXPECT_FALSE(q.use_sliding_window);
}

TEST(HFConfig, ReadsYarnScaling) {
  HFConfig c = parse_hf_config(
      minimal_config(R"("rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768})"));
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_EQ(c.rope_scaling->factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 32768);
  EXPECT_EQ(c.rope_scaling->beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_EQ(c.rope_scaling->attention_factor, 0.0);
  c = parse_hf_config(
      minimal_config(R"("rope_scaling":{"type":"yarn","factor":2,"beta_fast":16,"attention_factor":1.5})"));
  EXPECT_EQ(c.rope_scaling->beta_fast, 16.0);
  EXPECT_EQ(c.rope_scaling->attention_factor, 1.5);
  expect_config_error(minimal_config(R"("rope_scaling":{"rope_type":"yarn","factor":40,"mscale":1.0})"),
                      "rope_scaling.mscale': YaRN with mscale is not supported");
}

TEST(HFConfig, DefaultsAndNewerLayouts) {
  HFConfig c = parse_hf_config(minimal_config());
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.bos_token_ids.empty());
  EXPECT_TRUE(c.torch_dtype.empty());
  c = parse_hf_config(minimal_config(R"("head_dim":32,"attention_bias":true,"dtype":"float16")"));
  EXPECT_EQ(c.head_dim, 32);  // explicit head_dim need not be hidden/heads (Qwen3, Gemma)
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.torch_dtype, "float16");
  c = parse_hf_config(minimal_config(R"("rope_parameters":{"rope_type":"linear","factor":2,"rope_theta":5e5})"));
  EXPECT_EQ(c.rope_theta, 5e5);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "linear");
  EXPECT_EQ(c.rope_scaling->factor, 2.0);
  c = parse_hf_config(minimal_config(R"("rope_parameters":{"rope_type":"default","rope_theta":1234})"));
  EXPECT_EQ(c.rope_theta, 1234.0);
  EXPECT_FALSE(c.rope_scaling.has_value());
  c = parse_hf_config(minimal_config(R"("rope_scaling":{"type":"dynamic","factor":4.0})"));
  EXPECT_EQ(c.rope_scaling->type, "dynamic");
}

TEST(HFConfig, ReadsMixtureOfExpertsFields) {
  HFConfig c = parse_hf_config(minimal_config(R"("num_local_experts":8,"num_experts_per_tok":2)"));
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_TRUE(c.norm_topk_prob);
  c = parse_hf_config(
      minimal_config(R"("num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":false,)"
                     R"("decoder_sparse_step":1,"mlp_only_layers":[])"));
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_FALSE(c.has_mlp_only_layers);
  EXPECT_TRUE(parse_hf_config(minimal_config(R"("mlp_only_layers":[0,3])")).has_mlp_only_layers);
  expect_config_error(minimal_config(R"("num_experts":8,"num_experts_per_tok":9)"),
                      "'num_experts_per_tok' (9) must be in [1, 8]");
  expect_config_error(minimal_config(R"("num_experts":8)"), "'num_experts_per_tok' (0) must be in [1, 8]");
  expect_config_error(minimal_config(R"("mlp_only_layers":3)"), "field 'mlp_only_layers' is number");
}

TEST(HFConfig, RejectsWrongTypesAndMissingFields) {
  expect_config_error(R"({"architectures":["X"]})", "missing required field 'hidden_size'");
  expect_config_error(R"({"hidden_size":64})", "missing required field 'architectures'");
  expect_config_error(
      minimal_config().replace(minimal_config().find("\"hidden_size\":64"), 16, "\"hidden_size\":\"64\""),
      "field 'hidden_size' is string");
  expect_config_error(R"({"architectures":[],"hidden_size":64})", "field 'architectures' is array");
  expect_config_error(minimal_config(R"("num_key_value_heads":3)"), "'num_key_value_heads' (3) does not divide");
  expect_config_error(minimal_config(R"("num_key_value_heads":0)"), "field 'num_key_value_heads' is 0");
  expect_config_error(minimal_config(R"("max_position_embeddings":8192.0)"),
                      "field 'max_position_embeddings' is number");
  expect_config_error(minimal_config(R"("rms_norm_eps":"1e-5")"), "field 'rms_norm_eps' is string");
  expect_config_error(minimal_config(R"("rms_norm_eps":-1)"), "field 'rms_norm_eps' is -1");
  expect_config_error(minimal_config(R"("tie_word_embeddings":1)"), "field 'tie_word_embeddings' is number");
  expect_config_error(minimal_config(R"("eos_token_id":[1,"2"])"), "field 'eos_token_id' is array");
  expect_config_error(minimal_config(R"("bos_token_id":-1)"), "field 'bos_token_id' is number");
  expect_config_error(minimal_config(R"("rope_scaling":{"rope_type":"llama3","factor":8})"),
                      "missing required field 'rope_scaling.low_freq_factor'");
  expect_config_error(minimal_config(R"("rope_scaling":{"factor":8})"),
                      "missing required field 'rope_scaling.rope_type'");
  expect_config_error(minimal_config(R"("rope_scaling":{"rope_type":"linear","factor":0})"),
                      "field 'rope_scaling.factor' is 0");
  expect_config_error(minimal_config(R"("rope_scaling":"yes")"), "field 'rope_scaling' is string");
  expect_config_error(R"({"architectures":["X"],"hidden_size":60,"intermediate_size":1,"num_hidden_layers":1,)"
                      R"("num_attention_heads":7,"vocab_size":10})",
                      "not a multiple of 'num_attention_heads'");
  expect_config_error(minimal_config(R"("hidden_size":64)"), "duplicate key 'hidden_size'");
  expect_config_error("[1]", "not a JSON object");
  expect_config_error("{", "invalid JSON");
}
