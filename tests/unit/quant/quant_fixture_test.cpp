// Bit-exactness against independent references (tools/fixtures/make_quant_fixtures.py):
// synthetic rows quantized by gguf.quants / GGML's own quantize_row_*_ref, and the first
// layer of the default model dequantized by gguf.quants.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace tessera {
namespace {

using namespace quant_test;
using nlohmann::json;

json read_json(const std::string& path) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  return json::parse(bytes.begin(), bytes.end());
}

struct InputRow {
  int64_t offset = 0;  // in floats into inputs.f32
  int64_t n = 0;
};

class QuantFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    index_ = read_json(fixture_path("index.json"));
    inputs_ = read_f32(fixture_path("inputs.f32"));
    int64_t offset = 0;
    for (const auto& row : index_.at("inputs")) {
      rows_[row.at("name").get<std::string>()] = {offset, row.at("n").get<int64_t>()};
      offset += row.at("n").get<int64_t>();
    }
    ASSERT_EQ(offset, static_cast<int64_t>(inputs_.size())) << "inputs.f32 does not match index";
  }

  json index_;
  std::vector<float> inputs_;
  std::map<std::string, InputRow> rows_;
};

TEST_F(QuantFixture, CoversEveryFormatOfTheContract) {
  std::set<std::string> present;
  for (const auto& f : index_.at("formats")) present.insert(f.at("type").get<std::string>());
  for (DType t : block_and_plain_types()) {
    if (t == DType::F32) continue;  // identity, tested below without a fixture
    EXPECT_TRUE(present.count(std::string(dtype_name(t)))) << dtype_name(t) << " has no fixture";
  }
}

// Our quantize_row must give GGML's bytes and our dequantize_row GGML's floats, row by row;
// then random blocks must dequantize like GGML.
TEST_F(QuantFixture, QuantizeAndDequantizeMatchReferenceBitForBit) {
  for (const auto& format : index_.at("formats")) {
    const std::string name = format.at("type").get<std::string>();
    const DType type = dtype_from_name(name);
    ASSERT_NE(type, DType::Unknown) << name;
    SCOPED_TRACE(name + " (bytes: " + format.at("bytes_source").get<std::string>() +
                 ", floats: " + format.at("floats_source").get<std::string>() + ")");
    const std::vector<uint8_t> want_bytes = read_bytes(fixture_path(name + ".q"));
    const std::vector<float> want_floats = read_f32(fixture_path(name + ".f32"));

    int64_t byte_pos = 0, float_pos = 0, rows_checked = 0;
    for (const auto& row_name : format.at("rows")) {
      const InputRow row = rows_.at(row_name.get<std::string>());
      const int64_t row_bytes = dtype_row_bytes(type, row.n);
      ASSERT_LE(byte_pos + row_bytes, static_cast<int64_t>(want_bytes.size()));
      ASSERT_LE(float_pos + row.n, static_cast<int64_t>(want_floats.size()));
      const uint8_t* expect_q = want_bytes.data() + byte_pos;
      const float* expect_y = want_floats.data() + float_pos;

      std::vector<uint8_t> q(static_cast<size_t>(row_bytes), 0xAB);  // poison: every byte written
      quantize_row(type, inputs_.data() + row.offset, q.data(), row.n);
      const int64_t bad_byte = first_byte_mismatch(q.data(), expect_q, row_bytes);
      EXPECT_EQ(bad_byte, -1) << "quantize_row, row " << row_name << ": byte " << bad_byte << " (block "
                              << bad_byte / dtype_traits(type).block_bytes << ") is "
                              << int(q[bad_byte < 0 ? 0 : bad_byte]) << ", want "
                              << int(expect_q[bad_byte < 0 ? 0 : bad_byte]);

      std::vector<float> y(static_cast<size_t>(row.n));
      dequantize_row(type, expect_q, y.data(), row.n);
      const int64_t bad = first_bit_mismatch(y.data(), expect_y, row.n);
      EXPECT_EQ(bad, -1) << "dequantize_row, row " << row_name << ": element " << bad << " is " << y[bad < 0 ? 0 : bad]
                         << ", want " << expect_y[bad < 0 ? 0 : bad];

      byte_pos += row_bytes;
      float_pos += row.n;
      ++rows_checked;
    }
    EXPECT_GE(rows_checked, 10) << "too few rows to mean anything";

    // Random bit patterns (every field value, not only what a quantizer emits): dequantize only.
    const auto n_random = format.at("random_elements").get<int64_t>();
    ASSERT_GT(n_random, 0);
    ASSERT_EQ(byte_pos + dtype_row_bytes(type, n_random), static_cast<int64_t>(want_bytes.size()));
    ASSERT_EQ(float_pos + n_random, static_cast<int64_t>(want_floats.size()));
    std::vector<float> y(static_cast<size_t>(n_random));
    dequantize_row(type, want_bytes.data() + byte_pos, y.data(), n_random);
    const int64_t bad = first_bit_mismatch(y.data(), want_floats.data() + float_pos, n_random);
    EXPECT_EQ(bad, -1) << "dequantize_row of random blocks: element " << bad << " is " << y[bad < 0 ? 0 : bad]
                       << ", want " << want_floats[float_pos + (bad < 0 ? 0 : bad)];
  }
}

// 2048 generated super-blocks per format, compared through checksums: wide coverage of the
// K-quant searches (a change that alters one block in a few hundred shows up here).
TEST_F(QuantFixture, BulkRowsMatchReferenceChecksums) {
  const json& bulk = index_.at("bulk");
  const std::vector<float> x = bulk_inputs(bulk.at("n_blocks").get<int64_t>());
  std::vector<uint32_t> bits(x.size());
  std::memcpy(bits.data(), x.data(), x.size() * 4);
  const auto n = static_cast<int64_t>(x.size());
  ASSERT_EQ(hex64(checksum64<uint32_t>(0, bits.data(), n, 0)), bulk.at("inputs_checksum").get<std::string>())
      << "bulk_inputs() differs from the generator's";
  std::vector<float> y(x.size());
  for (const auto& [name, want] : bulk.at("formats").items()) {
    const DType type = dtype_from_name(name);
    ASSERT_NE(type, DType::Unknown) << name;
    std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(type, n)));
    quantize_row(type, x.data(), q.data(), n);
    EXPECT_EQ(hex64(checksum64<uint8_t>(0, q.data(), static_cast<int64_t>(q.size()), 0)),
              want.at("bytes_checksum").get<std::string>())
        << name << ": quantized bytes differ from the reference";
    dequantize_row(type, q.data(), y.data(), n);
    std::memcpy(bits.data(), y.data(), y.size() * 4);
    EXPECT_EQ(hex64(checksum64<uint32_t>(0, bits.data(), n, 0)), want.at("floats_checksum").get<std::string>())
        << name << ": dequantized floats differ from the reference";
  }
  EXPECT_EQ(bulk.at("formats").size(), block_and_plain_types().size() - 1);  // all but F32
}

TEST_F(QuantFixture, F32IsTheIdentity) {
  std::vector<float> q(inputs_.size()), y(inputs_.size());
  const auto n = static_cast<int64_t>(inputs_.size());
  quantize_row(DType::F32, inputs_.data(), q.data(), n);
  dequantize_row(DType::F32, q.data(), y.data(), n);
  EXPECT_EQ(first_bit_mismatch(q.data(), inputs_.data(), n), -1);
  EXPECT_EQ(first_bit_mismatch(y.data(), inputs_.data(), n), -1);
}

// ------------------------------------------------------------------- real model weights

std::string default_model_path(const std::string& file) {
  if (const char* cache = std::getenv("TESSERA_CACHE"); cache && *cache) {
    return std::string(cache) + "/" + file;
  }
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/tessera/models/" + file;
}

// Every first-layer tensor (Q4_1, F32) and token_embd (Q8_0) of the default model: the first
// rows must equal gguf.quants' dequantization exactly, and so must the whole tensor (compared
// through a position-sensitive checksum of the f32 bits).
TEST(QuantModel, DequantizesFirstLayerOfDefaultModelLikeGguf) {
  const json meta = read_json(fixture_path("model_blk0.json"));
  const std::string path = default_model_path(meta.at("model_file").get<std::string>());
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not fetched: " << path;
  const MappedFile file(path);
  ASSERT_EQ(file.size(), meta.at("file_size").get<uint64_t>()) << "different model file";
  const std::vector<float> samples = read_f32(fixture_path("model_blk0.f32"));

  std::set<std::string> types_seen;
  for (const auto& t : meta.at("tensors")) {
    const std::string name = t.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const DType type = dtype_from_name(t.at("type").get<std::string>());
    ASSERT_NE(type, DType::Unknown);
    types_seen.insert(std::string(dtype_name(type)));
    const auto row_len = t.at("row_len").get<int64_t>();
    const auto n_rows = t.at("n_rows").get<int64_t>();
    const auto offset = t.at("file_offset").get<uint64_t>();
    const auto n_bytes = t.at("n_bytes").get<uint64_t>();
    ASSERT_EQ(static_cast<uint64_t>(dtype_row_bytes(type, row_len) * n_rows), n_bytes);
    ASSERT_LE(offset + n_bytes, file.size());
    const uint8_t* data = file.data() + offset;

    ASSERT_EQ(hex64(checksum64<uint8_t>(0, data, static_cast<int64_t>(n_bytes), 0)),
              t.at("raw_checksum").get<std::string>())
        << "tensor bytes differ";

    const auto sample_rows = t.at("sample_rows").get<int64_t>();
    const auto sample_offset = t.at("sample_offset").get<int64_t>();
    ASSERT_LE(sample_offset + sample_rows * row_len, static_cast<int64_t>(samples.size()));
    std::vector<float> row(static_cast<size_t>(row_len));
    std::vector<uint32_t> bits(static_cast<size_t>(row_len));
    uint64_t sum = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      dequantize_row(type, data + r * dtype_row_bytes(type, row_len), row.data(), row_len);
      if (r < sample_rows) {
        const float* want = samples.data() + sample_offset + r * row_len;
        const int64_t bad = first_bit_mismatch(row.data(), want, row_len);
        ASSERT_EQ(bad, -1) << "row " << r << " element " << bad << ": " << row[bad < 0 ? 0 : bad] << " vs "
                           << want[bad < 0 ? 0 : bad];
      }
      std::memcpy(bits.data(), row.data(), row.size() * 4);
      sum = checksum64<uint32_t>(sum, bits.data(), row_len, static_cast<uint64_t>(r * row_len));
    }
    EXPECT_EQ(hex64(sum), t.at("dequant_checksum").get<std::string>()) << "some row past the samples differs";
  }
  EXPECT_EQ(types_seen, (std::set<std::string>{"F32", "Q4_1", "Q8_0"}));
}

}  // namespace
}  // namespace tessera
