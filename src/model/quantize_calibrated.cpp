// GPTQ and AWQ layer by layer (quantize_calibrated.h). Per layer: the four groups of linear
// layers that share an input (q/k/v; o; gate/up; down) get their input statistics from
// CalibForward's stages; GPTQ quantizes each group as soon as its statistics are complete, so
// the next group's inputs already pass through the quantized ones (and the next layer's
// through the whole quantized layer); AWQ, as llm-awq, searches its scales on the float
// layer's inputs and hands the float layer's output to the next layer.
#include "model/quantize_calibrated.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "model/quantize_calib_forward.h"
#include "quant/awq.h"
#include "quant/gptq.h"
#include "quant/group_quant.h"
#include "quant/quant.h"

namespace tessera {

const char* const kDecoderLinearNames[7] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                            "gate_proj", "up_proj", "down_proj"};

namespace {

enum Lin { kQ, kK, kV, kO, kGate, kUp, kDown };

WeightMatrix& linear(LayerWeights& l, int i) {
  WeightMatrix* m[7] = {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down};
  return *m[i];
}

std::vector<float> decode(const WeightMatrix& m) {
  std::vector<float> f(static_cast<size_t>(m.rows * m.cols));
  const int64_t row_bytes = m.row_bytes();
  for (int64_t r = 0; r < m.rows; ++r)
    dequantize_row(m.dtype, static_cast<const uint8_t*>(m.data) + r * row_bytes, f.data() + r * m.cols, m.cols);
  return f;
}

std::vector<float> dequantized(const GroupQuantMatrix& q) {
  const GroupQuantLayout& l = q.layout;
  std::vector<float> f(static_cast<size_t>(l.rows * l.cols));
  for (int64_t r = 0; r < l.rows; ++r) gq_dequantize_row(l, q.data.get(), r, f.data() + r * l.cols);
  return f;
}

// Σ_r d_r·H·d_rᵀ through one backend product (H symmetric: d·H = d·Hᵀ).
double output_error(Backend& be, const float* d, int64_t rows, int64_t cols, const std::vector<float>& h32) {
  std::vector<float> p(static_cast<size_t>(rows * cols));
  WeightMatrix hm;
  hm.data = h32.data();
  hm.dtype = DType::F32;
  hm.rows = hm.cols = cols;
  for (int64_t r0 = 0; r0 < rows; r0 += 4096) {
    const int n = static_cast<int>(std::min<int64_t>(4096, rows - r0));
    const MatmulTarget t[] = {{hm, p.data() + r0 * cols, cols}};
    be.matmul(d + r0 * cols, n, cols, t);
  }
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += static_cast<double>(p[i]) * d[i];
  return std::max(s, 0.0);
}

// The report of one matrix: q (the effective weights) against w on inputs with Gram h32.
CalibratedMatrixReport report(Backend& be, int which, const std::vector<float>& w, const std::vector<float>& q,
                              int64_t rows, int64_t cols, const std::vector<float>& h32,
                              const CalibratedQuantOptions& o) {
  CalibratedMatrixReport r;
  r.name = kDecoderLinearNames[which];
  r.rows = rows;
  r.cols = cols;
  const double ref = output_error(be, w.data(), rows, cols, h32);
  std::vector<float> d(w.size());
  double dw = 0, ww = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    d[i] = q[i] - w[i];
    dw += static_cast<double>(d[i]) * d[i];
    ww += static_cast<double>(w[i]) * w[i];
  }
  r.out_err = ref > 0 ? std::sqrt(output_error(be, d.data(), rows, cols, h32) / ref) : 0.0;
  r.weight_err = ww > 0 ? std::sqrt(dw / ww) : 0.0;
  const std::vector<float> rtn = dequantized(
      quantize_group_rtn(w.data(), rows, cols, o.bits, o.group_size < 0 ? cols : o.group_size, o.asymmetric));
  for (size_t i = 0; i < w.size(); ++i) d[i] = rtn[i] - w[i];
  r.rtn_out_err = ref > 0 ? std::sqrt(output_error(be, d.data(), rows, cols, h32) / ref) : 0.0;
  return r;
}

void check_options(const CalibratedQuantOptions& o) {
  TESSERA_CHECK(o.method == "gptq" || o.method == "awq", "quantize: method '", o.method,
                "' takes no calibration (gptq or awq)");
  TESSERA_CHECK(o.bits == 4 || o.bits == 8, "quantize: --bits ", o.bits,
                " (4 or 8; the group format has no 3-bit codes)");
  TESSERA_CHECK(o.group_size == -1 || (o.group_size >= 32 && o.group_size % 32 == 0), "quantize: --group-size ",
                o.group_size, " (-1, or a multiple of 32)");
  TESSERA_CHECK(o.damp > 0 && o.damp <= 1, "quantize: --damp ", o.damp, " (a fraction of the mean diagonal in (0, 1])");
  TESSERA_CHECK(!o.act_order || o.method == "gptq", "quantize: --act-order is a GPTQ option");
}

struct LayerState {
  LayerF32 f;                  // the weights the forward uses now
  std::vector<float> orig[7];  // the layer's weights as loaded
  GroupQuantMatrix q[7];       // the result
  std::vector<float> eff[7];   // what each quantized matrix applies to the unscaled input
  std::vector<float> h32[4];   // Gram matrices of the four inputs (q/k/v, o, gate/up, down)
};

int input_of(int which) { return which <= kV ? 0 : which == kO ? 1 : which <= kUp ? 2 : 3; }

void run_gptq(CalibForward& fw, Backend& be, LayerState& st, const ModelConfig& c, const CalibratedQuantOptions& o) {
  GptqOptions go;
  go.bits = o.bits;
  go.group_size = o.group_size;
  go.asymmetric = o.asymmetric;
  go.damp = o.damp;
  go.act_order = o.act_order;
  auto quantize_group = [&](InputStats& in, std::initializer_list<int> which, int input) {
    const GptqHessian h = gptq_prepare(in.gram.data(), in.d, o.damp, o.act_order);
    st.h32[input] = in.gram_f32();
    for (int i : which) {
      const int64_t rows = static_cast<int64_t>(st.orig[i].size()) / in.d;
      GptqResult r = gptq_quantize(st.orig[i].data(), rows, in.d, h, go, o.threads);
      st.q[i] = r.matrix;
      st.eff[i] = std::move(r.dequantized);
      st.f.m[i] = st.eff[i];
    }
  };
  const int64_t e = c.n_embd;
  InputStats a(e), b(static_cast<int64_t>(c.n_head) * c.head_dim), f(e), d(c.n_ff);
  fw.stage_a(st.f, a);
  quantize_group(a, {kQ, kK, kV}, 0);
  fw.stage_b(st.f, b);
  quantize_group(b, {kO}, 1);
  fw.stage_c(st.f, f);
  quantize_group(f, {kGate, kUp}, 2);
  fw.stage_d(st.f, d);
  quantize_group(d, {kDown}, 3);
  fw.stage_e(st.f);
}

// AWQ: the four scale searches on the float layer, the scales applied (folded into the norms,
// v_proj's rows and up_proj's rows), the clipping searches, then round-to-nearest.
std::vector<double> run_awq(CalibForward& fw, Backend& be, LayerState& st, const ModelConfig& c,
                            const CalibratedQuantOptions& o, ModelWeights& w) {
  AwqOptions ao;
  ao.bits = o.bits;
  ao.group_size = o.group_size;
  ao.asymmetric = o.asymmetric;
  const int64_t e = c.n_embd, qd = static_cast<int64_t>(c.n_head) * c.head_dim, ff = c.n_ff;
  InputStats in[4] = {InputStats(e), InputStats(qd), InputStats(e), InputStats(ff)};
  fw.stage_a(st.f, in[0]);
  fw.stage_b(st.f, in[1]);
  fw.stage_c(st.f, in[2]);
  fw.stage_d(st.f, in[3]);
  fw.stage_e(st.f);  // the next layer's input: the float layer's output, as llm-awq
  for (int i = 0; i < 4; ++i) st.h32[i] = in[i].gram_f32();

  auto rows_of = [&](int i) { return static_cast<int64_t>(st.orig[i].size()) / in[input_of(i)].d; };
  auto search = [&](std::initializer_list<int> which, int input) {
    std::vector<AwqMatrix> mats;
    for (int i : which) mats.push_back({st.orig[i].data(), rows_of(i)});
    const int64_t cols = in[input].d;
    const OutputError err = [&](const float* dw, int64_t rows) {
      return output_error(be, dw, rows, cols, st.h32[input]);
    };
    return awq_search_scales(mats, cols, in[input].abs_mean().data(), err, ao);
  };
  // o_proj's input is v's output only when every query head has its own value head.
  const bool fold_o = qd == static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  const AwqScales s_qkv = search({kQ, kK, kV}, 0);
  const AwqScales s_o = fold_o ? search({kO}, 1) : AwqScales{};
  const AwqScales s_gu = search({kGate, kUp}, 2);
  const AwqScales s_down = search({kDown}, 3);

  std::vector<float> w_s[7];
  for (int i = 0; i < 7; ++i) w_s[i] = st.orig[i];
  auto scale_cols = [&](int i, const std::vector<float>& s) {
    const int64_t cols = static_cast<int64_t>(s.size());
    for (size_t j = 0; j < w_s[i].size(); ++j) w_s[i][j] *= s[j % cols];
  };
  auto divide_rows = [&](int i, const std::vector<float>& s) {
    const int64_t cols = static_cast<int64_t>(w_s[i].size() / s.size());
    for (size_t j = 0; j < w_s[i].size(); ++j) w_s[i][j] /= s[j / cols];
  };
  auto divided = [&](const float* v, const std::vector<float>& s) {
    float* out = w.make_f32(s.size());
    for (size_t j = 0; j < s.size(); ++j) out[j] = v[j] / s[j];
    w.weight_bytes += static_cast<int64_t>(s.size() * 4);
    return out;
  };
  for (int i : {kQ, kK, kV}) scale_cols(i, s_qkv.s);
  st.f.attn_norm = divided(st.f.attn_norm, s_qkv.s);
  if (fold_o) {
    scale_cols(kO, s_o.s);
    divide_rows(kV, s_o.s);
    if (st.f.bv) st.f.bv = divided(st.f.bv, s_o.s);
  }
  for (int i : {kGate, kUp}) scale_cols(i, s_gu.s);
  st.f.ffn_norm = divided(st.f.ffn_norm, s_gu.s);
  scale_cols(kDown, s_down.s);
  divide_rows(kUp, s_down.s);

  // Clipping on the scaled weights against the scaled inputs' Gram (H / (s sᵀ)); q and k are
  // left unclipped, as llm-awq does (their error passes through the attention's softmax).
  const std::vector<float> ones(static_cast<size_t>(qd), 1.0f);
  const std::vector<float>* in_scale[4] = {&s_qkv.s, fold_o ? &s_o.s : &ones, &s_gu.s, &s_down.s};
  for (int k = 0; k < 4; ++k) {
    const int64_t d = in[k].d;
    const std::vector<float>& s = *in_scale[k];
    std::vector<double> hs(in[k].gram);
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b) hs[a * d + b] /= static_cast<double>(s[a]) * s[b];
    for (int i = 0; i < 7; ++i)
      if (input_of(i) == k && i != kQ && i != kK) awq_clip(w_s[i].data(), rows_of(i), d, hs.data(), ao, o.threads);
  }
  // Round-to-nearest of the scaled, clipped weights; eff undoes the scales for the report.
  for (int i = 0; i < 7; ++i) {
    const int64_t rows = rows_of(i), cols = in[input_of(i)].d;
    const int64_t gs = o.group_size < 0 ? cols : o.group_size;
    st.q[i] = quantize_group_rtn(w_s[i].data(), rows, cols, o.bits, gs, o.asymmetric);
    st.eff[i] = dequantized(st.q[i]);
    const std::vector<float>& s = *in_scale[input_of(i)];
    for (size_t j = 0; j < st.eff[i].size(); ++j) st.eff[i][j] /= s[j % cols];
    if (i == kUp)
      for (size_t j = 0; j < st.eff[i].size(); ++j) st.eff[i][j] *= s_down.s[j / cols];
    if (i == kV && fold_o)
      for (size_t j = 0; j < st.eff[i].size(); ++j) st.eff[i][j] *= s_o.s[j / cols];
  }
  return {s_qkv.alpha, fold_o ? s_o.alpha : NAN, s_gu.alpha, s_down.alpha};
}

}  // namespace

void quantize_calibrated(ModelWeights& w, Backend& be, std::span<const int32_t> tokens, const CalibratedQuantOptions& o,
                         const std::function<void(const CalibratedLayerReport&)>& on_layer) {
  check_options(o);
  for (const LayerWeights& l : w.layers)
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      TESSERA_CHECK(!is_group_quant(m->dtype), w.source, ": weights are group-quantized already");
  const ModelConfig& c = w.config;
  for (int32_t t : tokens)
    TESSERA_CHECK(t >= 0 && t < c.n_vocab, "quantize: calibration token ", t, " is outside the vocabulary");
  CalibForward fw(be, w, tokens, o.window);
  for (int il = 0; il < c.n_layer; ++il) {
    const auto t0 = std::chrono::steady_clock::now();
    LayerWeights& L = w.layers[il];
    LayerState st;
    for (int i = 0; i < 7; ++i) {
      st.orig[i] = decode(linear(L, i));
      st.f.m[i] = st.orig[i];
    }
    st.f.attn_norm = L.attn_norm;
    st.f.ffn_norm = L.ffn_norm;
    st.f.bq = L.bq;
    st.f.bk = L.bk;
    st.f.bv = L.bv;
    CalibratedLayerReport rep;
    rep.layer = il;
    rep.n_layers = c.n_layer;
    if (o.method == "gptq")
      run_gptq(fw, be, st, c, o);
    else
      rep.awq_alpha = run_awq(fw, be, st, c, o, w);
    for (int i = 0; i < 7; ++i) {
      const WeightMatrix& m = linear(L, i);
      rep.matrices.push_back(report(be, i, st.orig[i], st.eff[i], m.rows, m.cols, st.h32[input_of(i)], o));
    }
    // Into the model: the quantized matrices (and AWQ's folded norms and bias).
    L.attn_norm = st.f.attn_norm;
    L.ffn_norm = st.f.ffn_norm;
    L.bv = st.f.bv;
    for (int i = 0; i < 7; ++i) {
      WeightMatrix& m = linear(L, i);
      const GroupQuantLayout& gl = st.q[i].layout;
      w.weight_bytes += gl.total_bytes - m.bytes();
      w.owners.push_back(st.q[i].data);
      WeightMatrix q;
      q.data = st.q[i].data.get();
      q.dtype = o.bits == 8 ? DType::W8G : DType::W4G;
      q.rows = m.rows;
      q.cols = m.cols;
      q.group_size = gl.group_size;
      q.gq_zeros = gl.has_zeros;
      q.gq_perm = gl.has_perm;
      m = q;
    }
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_layer) on_layer(rep);
  }
}

}  // namespace tessera
