#include "model/quantize_weights.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <thread>
#include <vector>

#include "core/error.h"
#include "quant/fp8_weight.h"
#include "quant/group_quant.h"
#include "quant/quant.h"

namespace tessera {

bool parse_weight_quant_spec(const std::string& s, WeightQuantSpec* out) {
  if (s == "fp8") {
    *out = WeightQuantSpec{8, 0, false, true};
    return true;
  }
  if (s.size() < 3 || s[0] != 'w' || (s[1] != '4' && s[1] != '8')) return false;
  WeightQuantSpec spec;
  spec.bits = s[1] - '0';
  std::string rest = s.substr(2);
  if (!rest.empty() && rest.back() == 'a') {
    spec.asymmetric = true;
    rest.pop_back();
  }
  if (rest == "c") {
    spec.group = 0;
  } else {
    if (rest.size() < 2 || rest[0] != 'g') return false;
    int64_t n = 0;
    for (size_t i = 1; i < rest.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(rest[i])) || n > (1 << 20)) return false;
      n = n * 10 + (rest[i] - '0');
    }
    if (n < 32 || n % 32 != 0) fail("weight quantization '", s, "': the group size must be a multiple of 32");
    spec.group = n;
  }
  *out = spec;
  return true;
}

void quantize_linear_weights(ModelWeights& w, const WeightQuantSpec& spec) {
  std::vector<WeightMatrix*> todo;
  for (LayerWeights& l : w.layers)
    for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      TESSERA_CHECK(!is_group_quant(m->dtype) && !is_fp8_weight(m->dtype), w.source, ": weights are ",
                    dtype_name(m->dtype), " (quantized) already");
      TESSERA_CHECK(m->cols % dtype_traits(m->dtype).block_elems == 0, w.source, ": a ", dtype_name(m->dtype),
                    " matrix of width ", m->cols, " cannot be decoded");
      todo.push_back(m);
    }
  std::vector<GroupQuantMatrix> built(todo.size());
  std::vector<Fp8Matrix> built_fp8(todo.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    std::vector<float> f;
    for (size_t i; (i = next.fetch_add(1)) < todo.size();) {
      const WeightMatrix& m = *todo[i];
      f.resize(static_cast<size_t>(m.rows * m.cols));
      const int64_t row_bytes = m.row_bytes();
      for (int64_t r = 0; r < m.rows; ++r)
        dequantize_row(m.dtype, static_cast<const uint8_t*>(m.data) + r * row_bytes, f.data() + r * m.cols, m.cols);
      if (spec.fp8) {
        built_fp8[i] = quantize_fp8_rtn(f.data(), m.rows, m.cols);
        continue;
      }
      built[i] = quantize_group_rtn(f.data(), m.rows, m.cols, spec.bits, spec.group == 0 ? m.cols : spec.group,
                                    spec.asymmetric);
    }
  };
  const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < todo.size(); ++i) {
    WeightMatrix& m = *todo[i];
    if (spec.fp8) {
      WeightMatrix q{built_fp8[i].data.get(), DType::FP8W, m.rows, m.cols};
      w.weight_bytes += q.bytes() - m.bytes();
      w.owners.push_back(built_fp8[i].data);
      m = q;
      continue;
    }
    const GroupQuantLayout& l = built[i].layout;
    w.weight_bytes += l.total_bytes - m.bytes();
    w.owners.push_back(built[i].data);
    WeightMatrix q{built[i].data.get(), spec.bits == 8 ? DType::W8G : DType::W4G, m.rows, m.cols};
    q.group_size = l.group_size;
    q.gq_zeros = l.has_zeros;
    q.gq_perm = l.has_perm;
    m = q;
  }
}

}  // namespace tessera
