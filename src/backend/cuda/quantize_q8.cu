// Activations quantized per 32 columns for the integer decode kernels (gemv_gq.cu,
// gemv_blocks_q8.cu), with the CPU backend's Q8 numerics bit for bit (q8_rows.cuh). Act-order
// weights read x in their stored column order: the gather is folded in here. SwiGLU in front
// of a product (the FFN's down projection) is computed here too, so silu(gate) * up never
// goes through an f32 buffer. Programmatic dependent launches: the product after them
// requests its weights while these run.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/q8_producers.h"
#include "backend/cuda/q8_rows.cuh"

namespace tessera::cuda {

namespace {

// x[t, perm[j]] (perm nullptr: x[t, j]).
struct RowsInput {
  const float* x;
  int64_t ldx;
  const int32_t* perm;
  __device__ float operator()(int64_t t, int j) const { return x[t * ldx + (perm ? perm[j] : j)]; }
};

// silu(gate[t, j]) * up[t, j], as swiglu.cu computes it.
struct SwigluInput {
  const float* gate;
  const float* up;
  int64_t ld;
  __device__ float operator()(int64_t t, int j) const { return silu_times(gate[t * ld + j], up[t * ld + j]); }
};

// One warp per (row, 32-column block): lane j quantizes column 32b + j (0 past `cols`).
template <class Input>
__global__ void quantize_q8_rows_kernel(Input in, int n_rows, int cols, Q8Rows out) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int n_blocks = static_cast<int>(out.ld / 32);
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (item >= static_cast<int64_t>(n_rows) * n_blocks) return;  // whole warps: the shuffles below stay full
  const int64_t t = item / n_blocks;
  const int b = static_cast<int>(item % n_blocks);
  const int j = b * 32 + lane;
  q8_store_block(j < cols ? in(t, j) : 0.0f, out, t, b, lane);
}

template <class Input>
void launch_quantize(Input in, int n_rows, int64_t cols, const Q8Rows& out, cudaStream_t s) {
  const int64_t warps = n_rows * (out.ld / 32);
  launch_pdl(quantize_q8_rows_kernel<Input>, dim3(blocks_for(warps * 32, 256)), dim3(256), 0, s, in, n_rows,
             static_cast<int>(cols), out);
}

}  // namespace

Q8Rows q8_rows_view(void* buf, int n_rows, int64_t cols) {
  Q8Rows r;
  r.ld = (cols + 31) / 32 * 32;
  r.q = static_cast<int8_t*>(buf);
  r.meta = reinterpret_cast<int2*>(static_cast<uint8_t*>(buf) + (n_rows * r.ld + 255) / 256 * 256);
  return r;
}

size_t q8_rows_bytes(int n_rows, int64_t cols) {
  const int64_t ld = (cols + 31) / 32 * 32;
  return static_cast<size_t>((n_rows * ld + 255) / 256 * 256 + n_rows * (ld / 32) * 8);
}

void launch_quantize_q8_rows(const float* x, int n_rows, int64_t ldx, int64_t cols, const int32_t* perm, Q8Rows out,
                             cudaStream_t s) {
  TESSERA_CHECK(x && n_rows >= 1 && cols >= 1 && ldx >= cols && cols <= (int64_t{1} << 30),
                "cuda quantize_q8: bad shape (", n_rows, " rows, ", cols, " columns, stride ", ldx, ")");
  TESSERA_CHECK(out.ld == (cols + 31) / 32 * 32 && reinterpret_cast<uintptr_t>(out.q) % 16 == 0,
                "cuda quantize_q8: output not laid out by q8_rows_view");
  launch_quantize(RowsInput{x, ldx, perm}, n_rows, cols, out, s);
  TESSERA_CUDA_CHECK_LAUNCH("quantize_q8_rows");
}

void launch_swiglu_q8(const float* gate, const float* up, int64_t ld_in, int n_rows, int64_t dim, Q8Rows out,
                      cudaStream_t s) {
  TESSERA_CHECK(gate && up && n_rows >= 1 && dim >= 1 && ld_in >= dim && dim <= (int64_t{1} << 30),
                "cuda swiglu_q8: bad shape (", n_rows, " rows, ", dim, " columns, stride ", ld_in, ")");
  TESSERA_CHECK(out.ld == (dim + 31) / 32 * 32 && reinterpret_cast<uintptr_t>(out.q) % 16 == 0,
                "cuda swiglu_q8: output not laid out by q8_rows_view");
  launch_quantize(SwigluInput{gate, up, ld_in}, n_rows, dim, out, s);
  TESSERA_CUDA_CHECK_LAUNCH("swiglu_q8");
}

}  // namespace tessera::cuda
