#include "model/quantize_weights.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/error.h"
#include "quant/fp8_weight.h"
#include "core/mapped_file.h"
#include "quant/group_quant.h"
#include "quant/quant.h"

namespace tessera {

namespace {

bool parse_grid_name(const std::string& s, WeightQuantSpec* spec) {
  if (s.size() < 3 || s[0] != 'w' || (s[1] != '4' && s[1] != '8')) return false;
  spec->bits = s[1] - '0';
  std::string rest = s.substr(2);
  if (!rest.empty() && rest.back() == 'a') {
    spec->asymmetric = true;
    rest.pop_back();
  }
  if (rest == "c") {
    spec->group = 0;
    return true;
  }
  if (rest.size() < 2 || rest[0] != 'g') return false;
  int64_t n = 0;
  for (size_t i = 1; i < rest.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(rest[i])) || n > (1 << 20)) return false;
    n = n * 10 + (rest[i] - '0');
  }
  if (n < 32 || n % 32 != 0) fail("weight quantization '", s, "': the group size must be a multiple of 32");
  spec->group = n;
  return true;
}

}  // namespace

bool parse_weight_quant_spec(const std::string& s, WeightQuantSpec* out) {
  if (s == "fp8") {
    *out = WeightQuantSpec{};
    out->bits = 8;
    out->group = 0;
    out->fp8 = true;
    return true;
  }
  WeightQuantSpec spec;
  const size_t comma = s.find(',');
  std::string name = s.substr(0, comma);
  for (const char* m : {"rtn", "gptq", "awq"})
    if (name.rfind(std::string(m) + "-", 0) == 0) {
      spec.method = m;
      name = name.substr(spec.method.size() + 1);
    }
  if (!parse_grid_name(name, &spec)) return false;
  std::string rest = comma == std::string::npos ? "" : s.substr(comma + 1);
  while (!rest.empty()) {
    const size_t next = rest.find(',');
    const std::string item = rest.substr(0, next);
    rest = next == std::string::npos ? "" : rest.substr(next + 1);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto number = [&](double lo, double hi) {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      TESSERA_CHECK(!value.empty() && end && *end == '\0' && v >= lo && v <= hi, "weight quantization '", s, "': ", key,
                    "=", value, " is not a number in [", lo, ", ", hi, "]");
      return v;
    };
    if (key == "calib" && !value.empty())
      spec.calib_file = value;
    else if (key == "tokens")
      spec.calib_tokens = static_cast<int>(number(16, 1 << 24));
    else if (key == "window")
      spec.window = static_cast<int>(number(16, 8192));
    else if (key == "damp")
      spec.damp = number(1e-6, 1);
    else if (item == "act-order")
      spec.act_order = true;
    else
      fail("weight quantization '", s, "': unknown setting '", item,
           "' (calib=FILE, tokens=N, window=N, damp=X, act-order)");
  }
  TESSERA_CHECK(spec.method == "rtn" || !spec.calib_file.empty(), "weight quantization '", s, "': ", spec.method,
                " needs calibration text: add ,calib=FILE");
  TESSERA_CHECK(spec.method != "rtn" || (spec.calib_file.empty() && !spec.act_order), "weight quantization '", s,
                "': round-to-nearest takes no calibration settings");
  TESSERA_CHECK(!spec.act_order || spec.method == "gptq", "weight quantization '", s, "': act-order is a GPTQ setting");
  *out = spec;
  return true;
}

void quantize_linear_weights(ModelWeights& w, const WeightQuantSpec& spec) {
  TESSERA_CHECK(spec.method == "rtn", "weight quantization: ", spec.method, " needs calibration tokens");
  std::vector<WeightMatrix*> todo;
  for (LayerWeights& l : w.layers) {
    // A MoE layer's FFN is its experts (the small router matrix stays as stored).
    std::vector<WeightMatrix*> linear = {&l.wq, &l.wk, &l.wv, &l.wo};
    if (l.gate_exps.empty()) linear.insert(linear.end(), {&l.w_gate, &l.w_up, &l.w_down});
    for (auto* group : {&l.gate_exps, &l.up_exps, &l.down_exps})
      for (WeightMatrix& m : *group) linear.push_back(&m);
    for (WeightMatrix* m : linear) {
      TESSERA_CHECK(!is_group_quant(m->dtype) && !is_fp8_weight(m->dtype), w.source, ": weights are ",
                    dtype_name(m->dtype), " (quantized) already");
      TESSERA_CHECK(m->cols % dtype_traits(m->dtype).block_elems == 0, w.source, ": a ", dtype_name(m->dtype),
                    " matrix of width ", m->cols, " cannot be decoded");
      todo.push_back(m);
    }
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

void quantize_linear_weights_calibrated(ModelWeights& w, const WeightQuantSpec& spec,
                                        const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                                        Backend& be,
                                        const std::function<void(const CalibratedLayerReport&)>& on_layer) {
  TESSERA_CHECK(spec.method == "gptq" || spec.method == "awq", "weight quantization: ", spec.method,
                " takes no calibration");
  const MappedFile file(spec.calib_file);
  std::string text(reinterpret_cast<const char*>(file.data()), file.size());
  std::vector<int32_t> tokens = tokenize(text);
  if (static_cast<int64_t>(tokens.size()) > spec.calib_tokens) tokens.resize(static_cast<size_t>(spec.calib_tokens));
  TESSERA_CHECK(static_cast<int64_t>(tokens.size()) >= spec.window, spec.calib_file, ": ", tokens.size(),
                " calibration tokens, fewer than one window of ", spec.window);
  CalibratedQuantOptions o;
  o.method = spec.method;
  o.bits = spec.bits;
  o.group_size = spec.group == 0 ? -1 : spec.group;
  o.asymmetric = spec.asymmetric;
  o.damp = spec.damp;
  o.act_order = spec.act_order;
  o.window = spec.window;
  quantize_calibrated(w, be, tokens, o, on_layer);
}

std::string describe_calibrated_layer(const CalibratedLayerReport& r) {
  std::string s;
  char buf[160];
  std::snprintf(buf, sizeof buf, "layer %d/%d (%.1f s): output error vs RTN", r.layer + 1, r.n_layers, r.seconds);
  s += buf;
  for (const CalibratedMatrixReport& m : r.matrices) {
    std::snprintf(buf, sizeof buf, "  %s %.4f/%.4f", m.name.c_str(), m.out_err, m.rtn_out_err);
    s += buf;
  }
  if (!r.awq_alpha.empty()) {
    s += "  alpha";
    for (double a : r.awq_alpha) {
      if (std::isnan(a))
        s += " -";
      else
        std::snprintf(buf, sizeof buf, " %.2f", a), s += buf;
    }
  }
  return s;
}

}  // namespace tessera
