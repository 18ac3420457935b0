#include <gtest/gtest.h>

#include "gguf_builder.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;

namespace {

std::string default_model_path() {
  const char* cache = std::getenv("TESSERA_CACHE");
  std::string dir =
      cache ? cache : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/tessera/models";
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

// ---------------------------------------------------------------------------------------
// Files written by gguf-py (tests/fixtures/model/make_fixtures.py): an independent writer.

TEST(GGUFFixture, ReadsFileWrittenByGgufPy) {
  auto f = GGUFFile::open(std::string(TESSERA_FIXTURES_DIR) + "/model/tiny.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_string("general.name"), "tiny fixture");
  EXPECT_EQ(f->get_int("llama.block_count"), 2);
  EXPECT_EQ(f->get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(f->get_int("test.i8"), -7);
  EXPECT_EQ(f->get_int("test.u64"), int64_t{1} << 40);
  EXPECT_EQ(f->get_int("test.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(f->get_float("test.f64"), 0.125);
  EXPECT_EQ(f->get_int("test.u16"), 65535);
  EXPECT_EQ(f->get_int("test.i16"), -32768);
  const GGUFValue* nested = f->find("test.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->type, GGUFType::ARRAY);
  EXPECT_EQ(nested->elem_type, GGUFType::ARRAY);
  EXPECT_EQ(nested->array_len, 2u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string_view>{"<unk>", "<s>", "</s>", "hi", " there"}));
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores"), (std::vector<double>{0.0, -1.0, -2.0, -3.5, -4.25}));
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type"), (std::vector<int64_t>{2, 3, 3, 1, 1}));
  EXPECT_NO_THROW(validate_tokenizer_metadata(*f));

  ASSERT_EQ(f->tensors().size(), 3u);
  const GGUFTensorInfo& a = f->tensors()[0];
  EXPECT_EQ(a.name, "a.weight");
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(a.n_elements(), 12);
  EXPECT_EQ(a.n_bytes, 48u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u);  // mapped at a page boundary
  for (int i = 0; i < 12; ++i) {
    float v;
    std::memcpy(&v, a.data + 4 * i, 4);
    EXPECT_EQ(v, 0.5f * i);
  }
  const GGUFTensorInfo* b = f->find_tensor("b.bias");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::F16);
  EXPECT_EQ(b->n_bytes, 10u);
  EXPECT_EQ(b->offset, 64u);
  uint16_t h[5];
  std::memcpy(h, b->data, 10);
  EXPECT_EQ(h[0], 0x3c00);  // 1.0
  EXPECT_EQ(h[3], 0x7bff);  // 65504
  const GGUFTensorInfo* c = f->find_tensor("c.weight");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::Q8_0);
  EXPECT_EQ(c->shape, (std::vector<int64_t>{64, 2}));
  EXPECT_EQ(c->n_bytes, 4u * 34u);
  EXPECT_EQ(c->offset, 128u);
  // First block of row 0 = linspace(-1, 1, 128)[0:32]: d = fp16(1/127), q[0] = -127.
  EXPECT_EQ(c->data[0] | (c->data[1] << 8), 0x2008);
  EXPECT_EQ(static_cast<int8_t>(c->data[2]), -127);
}

TEST(GGUFFixture, OpenNamesTheFileInErrors) {
  try {
    GGUFFile::open(std::string(TESSERA_FIXTURES_DIR) + "/model/no-such-file.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-file.gguf"), std::string::npos) << e.what();
  }
  try {
    GGUFFile::open(std::string(TESSERA_FIXTURES_DIR) + "/model/tiny.safetensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny.safetensors: not a GGUF file"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------
// Files written in memory by a small writer, then broken one way at a time.

namespace {

using namespace tessera::test;

// A small valid model: metadata of several types and three tensors whose data ends exactly
// at the end of the file, so that every shorter prefix of it is invalid.
GGUFBuilder valid_builder() {
  GGUFBuilder b;
  b.string("general.architecture", "llama")
      .u32("llama.block_count", 1)
      .f32("llama.rope.freq_base", 10000.0f)
      .boolean("tokenizer.ggml.add_bos_token", true)
      .strings("tokenizer.ggml.tokens", {"a", "b", "c", "d"})
      .f32s("tokenizer.ggml.scores", {0, -1, -2, -3})
      .i32s("tokenizer.ggml.token_type", {1, 1, 1, 3})
      .u32("tokenizer.ggml.bos_token_id", 1)
      .u32("tokenizer.ggml.eos_token_id", 3);
  b.tensor("tok", {8, 4}, kF32, 0, 128)      // 32 f32
      .tensor("w", {64, 2}, kQ4_1, 128, 80)  // 2 rows of 2 Q4_1 blocks of 20 bytes
      .tensor("n", {3}, kF16, 224, 6);       // 208 rounded up to 32
  return b;
}

// Parses a copy of exactly `bytes.size()` bytes (so that AddressSanitizer sees any read past
// the end) and expects a tessera::Error whose message contains `needle`.
void expect_rejected(const std::vector<uint8_t>& bytes, std::string_view needle) {
  const std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(bytes.size(), 1)]);
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  try {
    GGUFFile::parse(copy.get(), bytes.size(), "bad.gguf");
    ADD_FAILURE() << "accepted a file that should fail with '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << "message does not start with the file name: " << msg;
  }
}

std::unique_ptr<GGUFFile> parse_ok(const std::vector<uint8_t>& bytes) {
  return GGUFFile::parse(bytes.data(), bytes.size(), "ok.gguf");
}

}  // namespace

TEST(GGUFParse, ValidFileRoundTrips) {
  const auto bytes = valid_builder().build();
  auto f = parse_ok(bytes);
  EXPECT_EQ(f->name(), "ok.gguf");
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->metadata().size(), 9u);
  EXPECT_EQ(f->get_int("llama.block_count"), 1);
  EXPECT_EQ(f->get_float("llama.block_count"), 1.0);  // integers widen
  EXPECT_FALSE(f->get_int("absent").has_value());
  EXPECT_FALSE(f->has("absent"));
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 4u);
  ASSERT_EQ(f->tensors().size(), 3u);
  const uint64_t data_start = bytes.size() - 230;
  EXPECT_EQ(data_start % 32, 0u);
  const GGUFTensorInfo* w = f->find_tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::Q4_1);
  EXPECT_EQ(w->n_bytes, 80u);
  EXPECT_EQ(w->n_elements(), 128);
  EXPECT_EQ(w->data, bytes.data() + data_start + 128);
  EXPECT_EQ(w->data[0], static_cast<uint8_t>(128 * 7 + 1));  // the builder's byte pattern
  EXPECT_EQ(f->find_tensor("n")->n_bytes, 6u);
  EXPECT_EQ(f->find_tensor("n")->data + 6, bytes.data() + bytes.size());
  EXPECT_NO_THROW(validate_tokenizer_metadata(*f));
}

TEST(GGUFParse, AcceptsVersion2AndEmptyModels) {
  auto b = valid_builder();
  b.version = 2;
  EXPECT_EQ(parse_ok(b.build())->version(), 2u);
  GGUFBuilder empty;  // no keys, no tensors, no data section
  auto f = parse_ok(empty.build());
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
}

TEST(GGUFParse, RejectsEveryTruncation) {
  const auto bytes = valid_builder().build();
  for (size_t n = 0; n < bytes.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    // Header cuts say "truncated"; cuts in the data say "runs past end of file".
    const std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(n, 1)]);
    if (n > 0) std::memcpy(copy.get(), prefix.data(), n);  // data() of an empty vector may be null
    try {
      GGUFFile::parse(copy.get(), n, "bad.gguf");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("runs past end of file") != std::string::npos)
          << msg;
    }
  }
}

TEST(GGUFParse, RejectsBadMagicAndVersions) {
  auto bytes = valid_builder().build();
  bytes[0] = 'X';
  expect_rejected(bytes, "not a GGUF file");
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    auto b = valid_builder();
    b.version = v;
    expect_rejected(b.build(), v == 1             ? "version 1 is not supported"
                               : v == 0x03000000u ? "big-endian"
                                                  : "unknown GGUF version");
  }
}

TEST(GGUFParse, RejectsHugeCounts) {
  for (uint64_t n : {~uint64_t{0}, ~uint64_t{0} - 7, uint64_t{1} << 63}) {
    auto b = valid_builder();
    b.tensor_count = n;
    expect_rejected(b.build(), "tensor count");
    b = valid_builder();
    b.key_count = n;
    expect_rejected(b.build(), "metadata key count");
  }
  // Under the limits but more than the file can hold.
  auto b = valid_builder();
  b.tensor_count = 100000;
  expect_rejected(b.build(), "cannot fit");
  b = valid_builder();
  b.key_count = 10;  // one more than written: the reader runs into the tensor infos
  auto bytes = b.build();
  EXPECT_THROW(GGUFFile::parse(bytes.data(), bytes.size()), Error);
}

TEST(GGUFParse, RejectsHugeStringAndArrayLengths) {
  for (uint64_t len : {~uint64_t{0}, ~uint64_t{0} - 3, uint64_t{1} << 40}) {
    GGUFBuilder b;
    Bytes& kv = b.key("k", GGUFType::STRING);
    kv.put<uint64_t>(len);
    kv.put<uint64_t>(0);
    expect_rejected(b.build(), "string value length");

    GGUFBuilder k;  // the key itself
    Bytes& raw = k.key("", GGUFType::U8);
    raw.bytes().resize(raw.bytes().size() - 12);  // drop the empty key and type
    raw.put<uint64_t>(len);
    raw.put<uint64_t>(0);
    expect_rejected(k.build(), "key length");

    GGUFBuilder a;
    Bytes& arr = a.key("arr", GGUFType::ARRAY);
    arr.put(static_cast<uint32_t>(GGUFType::U32));
    arr.put<uint64_t>(len);
    expect_rejected(a.build(), "array length");

    auto t = valid_builder();
    Bytes& ti = t.raw_tensor_infos();
    ti.put<uint64_t>(len);
    expect_rejected(t.build(), "name length");
  }
  // Lengths under the limits but longer than what is left.
  GGUFBuilder b;
  Bytes& kv = b.key("k", GGUFType::STRING);
  kv.put<uint64_t>(1000);
  kv.put<uint64_t>(0);
  expect_rejected(b.build(), "runs past end of file");
  GGUFBuilder a;
  Bytes& arr = a.key("arr", GGUFType::ARRAY);
  arr.put(static_cast<uint32_t>(GGUFType::STRING));
  arr.put<uint64_t>(1000);
  arr.str("x");
  expect_rejected(a.build(), "array of 1000 strings runs past end of file");
  GGUFBuilder c;
  Bytes& arr2 = c.key("arr", GGUFType::ARRAY);
  arr2.put(static_cast<uint32_t>(GGUFType::F64));
  arr2.put<uint64_t>(3);
  arr2.put(1.0);
  expect_rejected(c.build(), "array of 3 f64 runs past end of file");
}

TEST(GGUFParse, RejectsUnknownValueTypesAndBadBools) {
  GGUFBuilder b;
  b.key("k", static_cast<GGUFType>(13)).put<uint32_t>(0);
  expect_rejected(b.build(), "key 'k': unknown value type 13");
  GGUFBuilder a;
  Bytes& arr = a.key("arr", GGUFType::ARRAY);
  arr.put<uint32_t>(0xffffffffu);
  arr.put<uint64_t>(1);
  expect_rejected(a.build(), "key 'arr': unknown value type 4294967295");
  GGUFBuilder c;
  c.key("flag", GGUFType::BOOL).put<uint8_t>(2);
  expect_rejected(c.build(), "key 'flag': bool value 2");
}

TEST(GGUFParse, NestedArraysAreCheckedAndDepthLimited) {
  const auto nest = [](int depth) {
    GGUFBuilder b;
    Bytes& v = b.key("nested", GGUFType::ARRAY);
    for (int i = 0; i < depth - 1; ++i) {
      v.put(static_cast<uint32_t>(GGUFType::ARRAY));
      v.put<uint64_t>(1);
    }
    v.put(static_cast<uint32_t>(GGUFType::U16));
    v.put<uint64_t>(2);
    v.put<uint16_t>(1);
    v.put<uint16_t>(2);
    return b;
  };
  auto f = parse_ok(nest(4).build());
  EXPECT_EQ(f->find("nested")->elem_type, GGUFType::ARRAY);
  EXPECT_THROW(f->get_int_array("nested"), Error);
  expect_rejected(nest(5).build(), "nested deeper than 4");
  auto short_inner = nest(3).build();
  short_inner.pop_back();
  expect_rejected(short_inner, "truncated");
}

TEST(GGUFParse, RejectsBadDims) {
  auto b = valid_builder();
  b.tensor("x", {1, 1, 1, 1, 1}, kF32, 256, 4);
  expect_rejected(b.build(), "tensor 'x': n_dims 5 is outside 1..4");
  b = valid_builder();
  b.tensor("x", {}, kF32, 256, 4);
  expect_rejected(b.build(), "tensor 'x': n_dims 0");
  b = valid_builder();
  b.tensor("x", {4, 0}, kF32, 256, 4);
  expect_rejected(b.build(), "tensor 'x': dimension 1 is 0");
  b = valid_builder();
  b.tensor("x", {static_cast<uint64_t>(int64_t{-4})}, kF32, 256, 4);
  expect_rejected(b.build(), "tensor 'x': dimension 0 is 18446744073709551612, over the int64 limit");
  b = valid_builder();
  b.tensor("x", {uint64_t{1} << 32, uint64_t{1} << 32}, kF32, 256, 4);
  expect_rejected(b.build(), "tensor 'x': element count overflows");
  b = valid_builder();
  b.tensor("x", {uint64_t{1} << 62, 1}, kF32, 256, 4);  // 2^62 elements, 2^64 bytes
  expect_rejected(b.build(), "tensor 'x': byte size overflows");
  b = valid_builder();
  b.tensor("x", {uint64_t{1} << 40, uint64_t{1} << 20}, kF32, 256, 4);  // 2^62 bytes: fits 64 bits
  expect_rejected(b.build(), "tensor 'x': data [");
}

TEST(GGUFParse, RejectsUnknownAndUnsupportedTypes) {
  auto b = valid_builder();
  b.tensor("x", {32}, 99, 256, 4);
  expect_rejected(b.build(), "tensor 'x': unknown tensor type id 99");
  b = valid_builder();
  b.tensor("x", {256}, 10, 256, 84);
  expect_rejected(b.build(), "type id 10 (Q2_K)");
  b = valid_builder();
  b.tensor("x", {4}, 26, 256, 16);
  expect_rejected(b.build(), "tensor 'x': tensor type I32 is not supported");
}

TEST(GGUFParse, RejectsRowsNotAMultipleOfTheBlock) {
  auto b = valid_builder();
  b.tensor("x", {48, 2}, kQ4_1, 256, 60);
  expect_rejected(b.build(), "tensor 'x': row length 48 is not a multiple of the Q4_1 block size 32");
}

TEST(GGUFParse, RejectsDataPastEndOfFile) {
  auto b = valid_builder();
  b.tensor("x", {8}, kF32, 256, 32);
  b.set_data_size(256 + 31);
  expect_rejected(b.build(), "tensor 'x': data [");
  auto bytes = b.build();
  try {
    GGUFFile::parse(bytes.data(), bytes.size(), "m.gguf");
    FAIL();
  } catch (const Error& e) {
    const uint64_t start = bytes.size() - (256 + 31);
    const std::string expect = "m.gguf: tensor 'x': data [" + std::to_string(start + 256) + ", " +
                               std::to_string(start + 288) + ") runs past end of file (size " +
                               std::to_string(bytes.size()) + ")";
    EXPECT_EQ(e.what(), expect);
  }
  b = valid_builder();
  b.tensor("x", {8}, kF32, ~uint64_t{0} - 31, 0);
  expect_rejected(b.build(), "overflows 64 bits");
}

TEST(GGUFParse, RejectsOverlappingTensors) {
  auto b = valid_builder();
  b.tensor("x", {8}, kF32, 96, 32);  // inside 'tok' [0, 128)
  expect_rejected(b.build(), "tensor 'x': data at offset 96 overlaps tensor 'tok' [0, 128)");
  b = valid_builder();
  b.tensor("x", {8}, kF32, 0, 32);  // same start
  expect_rejected(b.build(), "overlaps");
}

TEST(GGUFParse, RejectsMisalignedOffsets) {
  auto b = valid_builder();
  b.tensor("x", {4}, kF32, 240, 16);
  expect_rejected(b.build(), "tensor 'x': data offset 240 is not a multiple of the alignment 32");
}

TEST(GGUFParse, ChecksAlignmentKey) {
  for (uint32_t a : {0u, 48u, 1u << 21}) {
    auto b = valid_builder();
    b.u32("general.alignment", a);
    expect_rejected(b.build(), a == 0    ? "'general.alignment': value is 0"
                               : a == 48 ? "'general.alignment': value 48 is not a power of two"
                                         : "'general.alignment': value 2097152 is over the limit");
  }
  auto b = valid_builder();
  b.string("general.alignment", "64");
  expect_rejected(b.build(), "'general.alignment' has type string");
  b = valid_builder();
  b.i32("general.alignment", -64);
  expect_rejected(b.build(), "value -64 is negative");

  // A valid larger alignment moves the data section and is required of every offset.
  GGUFBuilder g;
  g.u32("general.alignment", 256);
  g.padding_alignment = 256;
  g.tensor("a", {4}, kF32, 0, 16).tensor("b", {4}, kF32, 256, 16);
  const auto bytes = g.build();
  auto f = parse_ok(bytes);
  EXPECT_EQ(f->alignment(), 256u);
  EXPECT_EQ((f->find_tensor("a")->data - bytes.data()) % 256, 0);
  GGUFBuilder m;
  m.u32("general.alignment", 256);
  m.padding_alignment = 256;
  m.tensor("a", {4}, kF32, 0, 16).tensor("b", {4}, kF32, 32, 16);
  expect_rejected(m.build(), "tensor 'b': data offset 32 is not a multiple of the alignment 256");
}

TEST(GGUFParse, RejectsDuplicates) {
  auto b = valid_builder();
  b.tensor("w", {4}, kF32, 256, 16);
  expect_rejected(b.build(), "tensor 'w': duplicate tensor name");
  b = valid_builder();
  b.u32("llama.block_count", 2);
  expect_rejected(b.build(), "key 'llama.block_count': duplicate key");
}

TEST(GGUFParse, RejectsEmptyNames) {
  auto b = valid_builder();
  b.tensor("", {4}, kF32, 256, 16);
  expect_rejected(b.build(), "tensor #3: empty tensor name");
  b = valid_builder();
  b.u32("", 1);
  expect_rejected(b.build(), "metadata key #9: empty key");
}

TEST(GGUFParse, TypedGettersNameTheKey) {
  auto f = parse_ok(valid_builder().build());
  const auto expect_msg = [](auto&& fn, std::string_view needle) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { f->get_int("general.architecture"); },
             "key 'general.architecture' has type string, expected an integer");
  expect_msg([&] { f->get_string("llama.block_count"); }, "key 'llama.block_count' has type u32, expected string");
  expect_msg([&] { f->get_bool("llama.block_count"); }, "expected bool");
  expect_msg([&] { f->get_float("general.architecture"); }, "expected a number");
  expect_msg([&] { f->get_string_array("missing.key"); }, "missing key 'missing.key'");
  expect_msg([&] { f->get_float_array("tokenizer.ggml.token_type"); }, "has type array of i32, expected array of f32");
  expect_msg([&] { f->get_int_array("tokenizer.ggml.tokens"); },
             "has type array of string, expected array of integers");
}

TEST(GGUFTokenizerChecks, RejectsInconsistentVocabularies) {
  const auto check = [](GGUFBuilder b, std::string_view needle) {
    const auto bytes = b.build();
    auto f = parse_ok(bytes);
    try {
      validate_tokenizer_metadata(*f);
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  GGUFBuilder b;
  b.strings("tokenizer.ggml.tokens", {"a", "b", "c"}).f32s("tokenizer.ggml.scores", {0, 1});
  check(b, "key 'tokenizer.ggml.scores' has 2 entries but 'tokenizer.ggml.tokens' has 3");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a", "b", "c"}).i32s("tokenizer.ggml.token_type", {1, 1, 1, 1});
  check(b, "key 'tokenizer.ggml.token_type' has 4 entries");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a", "b", "c"}).u32("tokenizer.ggml.eos_token_id", 3);
  check(b, "key 'tokenizer.ggml.eos_token_id': token id 3 is outside the vocabulary [0, 3)");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a", "b", "c"}).u32("tokenizer.ggml.bos_token_id", 1000000000);
  check(b, "key 'tokenizer.ggml.bos_token_id': token id 1000000000 is outside the vocabulary [0, 3)");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a", "b", "c"}).i32("tokenizer.ggml.eot_token_id", -1);
  check(b, "key 'tokenizer.ggml.eot_token_id': token id -1 is outside");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a"}).string("tokenizer.ggml.bos_token_id", "1");
  check(b, "'tokenizer.ggml.bos_token_id' has type string");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {});
  check(b, "vocabulary is empty");
  b = GGUFBuilder();
  b.u32("tokenizer.ggml.bos_token_id", 0);
  check(b, "missing key 'tokenizer.ggml.tokens'");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a"}).strings("tokenizer.ggml.scores", {"0"});
  check(b, "'tokenizer.ggml.scores' has type array of string");
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a", "b"}).i32s("tokenizer.ggml.scores", {0});
  check(b, "key 'tokenizer.ggml.scores' has 1 entries but 'tokenizer.ggml.tokens' has 2");
  // Optional ids outside the vocabulary are the tokenizer's to warn about and reset; i32
  // scores are what some converters write.
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a", "b", "c"})
      .i32("tokenizer.ggml.padding_token_id", -1)
      .u32("tokenizer.ggml.unknown_token_id", 3)
      .i32s("tokenizer.ggml.scores", {0, 1, 2});
  EXPECT_NO_THROW(validate_tokenizer_metadata(*parse_ok(b.build())));
  // Keys that merely look similar are not token ids.
  b = GGUFBuilder();
  b.strings("tokenizer.ggml.tokens", {"a"}).u32("general.bos_token_id", 99).u32("tokenizer.ggml._token_id", 99);
  EXPECT_NO_THROW(validate_tokenizer_metadata(*parse_ok(b.build())));
}

namespace tessera {
namespace {
// The tokenizer runs the checks: a bad EOS or BOS never reaches serving (issue 20).
TEST(GGUFTokenizerChecks, TokenizerFromGgufRejectsBadRequiredIds) {
  for (const auto& [key, value] : {std::pair<std::string, uint32_t>{"tokenizer.ggml.eos_token_id", 1000000000},
                                   {"tokenizer.ggml.bos_token_id", 3}}) {
    GGUFBuilder b;
    b.string("tokenizer.ggml.model", "gpt2")
        .strings("tokenizer.ggml.tokens", {"a", "b", "c"})
        .strings("tokenizer.ggml.merges", {})
        .u32(key, value);
    const auto bytes = b.build();
    const auto f = parse_ok(bytes);
    try {
      Tokenizer::from_gguf(*f);
      ADD_FAILURE() << key << " = " << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("key '" + key + "': token id " + std::to_string(value) +
                                           " is outside the vocabulary [0, 3)"),
                std::string::npos)
          << e.what();
    }
  }
}
}  // namespace
}  // namespace tessera
