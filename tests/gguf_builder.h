#pragma once
// A GGUF writer for tests: writes anything, including what a reader must reject.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"

namespace tessera::test {

inline constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_1 = 3;

class Bytes {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b_.insert(b_.end(), p, p + sizeof(T));
  }
  void str(std::string_view s) {
    put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
  }
  void append(const Bytes& o) { b_.insert(b_.end(), o.b_.begin(), o.b_.end()); }
  const std::vector<uint8_t>& bytes() const { return b_; }
  std::vector<uint8_t>& bytes() { return b_; }

 private:
  std::vector<uint8_t> b_;
};

// A GGUF writer that lets a test write anything, including what a reader must reject.
class GGUFBuilder {
 public:
  uint32_t version = 3;
  uint64_t padding_alignment = 32;                  // how the data section is placed (not the key)
  std::optional<uint64_t> tensor_count, key_count;  // override the true counts

  // Key and type; the caller writes the value into kv().
  Bytes& key(std::string_view k, GGUFType t) {
    kv_.str(k);
    kv_.put(static_cast<uint32_t>(t));
    ++n_kv_;
    return kv_;
  }
  GGUFBuilder& u32(std::string_view k, uint32_t v) {
    key(k, GGUFType::U32).put(v);
    return *this;
  }
  GGUFBuilder& i32(std::string_view k, int32_t v) {
    key(k, GGUFType::I32).put(v);
    return *this;
  }
  GGUFBuilder& f32(std::string_view k, float v) {
    key(k, GGUFType::F32).put(v);
    return *this;
  }
  GGUFBuilder& boolean(std::string_view k, bool v) {
    key(k, GGUFType::BOOL).put<uint8_t>(v);
    return *this;
  }
  GGUFBuilder& string(std::string_view k, std::string_view v) {
    key(k, GGUFType::STRING).str(v);
    return *this;
  }
  GGUFBuilder& strings(std::string_view k, const std::vector<std::string>& v) {
    Bytes& b = key(k, GGUFType::ARRAY);
    b.put(static_cast<uint32_t>(GGUFType::STRING));
    b.put<uint64_t>(v.size());
    for (const auto& s : v) b.str(s);
    return *this;
  }
  GGUFBuilder& f32s(std::string_view k, const std::vector<float>& v) {
    Bytes& b = key(k, GGUFType::ARRAY);
    b.put(static_cast<uint32_t>(GGUFType::F32));
    b.put<uint64_t>(v.size());
    for (float x : v) b.put(x);
    return *this;
  }
  GGUFBuilder& i32s(std::string_view k, const std::vector<int32_t>& v) {
    Bytes& b = key(k, GGUFType::ARRAY);
    b.put(static_cast<uint32_t>(GGUFType::I32));
    b.put<uint64_t>(v.size());
    for (int32_t x : v) b.put(x);
    return *this;
  }
  // A tensor whose data occupies [offset, offset + n_bytes) of the data section.
  GGUFBuilder& tensor(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset,
                      uint64_t n_bytes) {
    ti_.str(name);
    ti_.put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) ti_.put(d);
    ti_.put(type);
    ti_.put(offset);
    ++n_ti_;
    // Only small test data is materialized; absurd offsets stay absurd in the header.
    if (offset < (uint64_t{1} << 20) && n_bytes < (uint64_t{1} << 20))
      data_size_ = std::max(data_size_, offset + n_bytes);
    return *this;
  }
  // An F32 tensor with real contents, placed after the previous ones (32-byte aligned).
  GGUFBuilder& tensor_f32(std::string_view name, const std::vector<uint64_t>& dims, const std::vector<float>& v) {
    uint64_t offset = (payload_.size() + 31) / 32 * 32;
    payload_.resize(offset, 0);
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    payload_.insert(payload_.end(), p, p + 4 * v.size());
    return tensor(name, dims, kF32, offset, 4 * v.size());
  }
  Bytes& raw_tensor_infos() {
    ++n_ti_;
    return ti_;
  }
  void set_data_size(uint64_t n) { data_size_ = n; }

  std::vector<uint8_t> build() const {
    Bytes out;
    out.put<uint32_t>(0x46554747u);
    out.put(version);
    out.put<uint64_t>(tensor_count.value_or(n_ti_));
    out.put<uint64_t>(key_count.value_or(n_kv_));
    out.append(kv_);
    out.append(ti_);
    if (data_size_ > 0) {
      while (out.bytes().size() % padding_alignment) out.put<uint8_t>(0);
      for (uint64_t i = 0; i < data_size_; ++i)
        out.put<uint8_t>(i < payload_.size() ? payload_[i] : static_cast<uint8_t>(i * 7 + 1));
    }
    return out.bytes();
  }

 private:
  Bytes kv_, ti_;
  std::vector<uint8_t> payload_;
  uint64_t n_kv_ = 0, n_ti_ = 0, data_size_ = 0;
};

}  // namespace tessera::test
