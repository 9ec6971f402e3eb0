/* The small per-token operations of a Llama-family block, fused, for x86-64 CPUs (float32).
 *
 * Why: at batch 1 a decode step of a small model is as much tensor-op dispatch as
 * arithmetic: an RMSNorm written in PyTorch is eight ops (~3 us each) for 384 numbers,
 * the rotary embedding seven per tensor.  Here each is one call.
 *
 * ls_rms_norm: y = w * (s * (1 / sqrt(mean(s^2) + eps))) per row, where s = x, or
 *   s = x + r (stored to `sum`) for a residual add fused in front.  Its rounding is its
 *   own (a fixed summation order), so LightSpec installs it in the model's norm modules:
 *   every forward of the model runs this same code.
 * ls_rotary: HF's rotary embedding, out = x * cos + rotate_half(x) * sin, rounded exactly
 *   as PyTorch's separate elementwise ops round it (each product and the sum rounded to
 *   float32, no fused multiply-add), so it reproduces the model's own forward bit for bit.
 */
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

/* x, r, sum, y: [rows, H] with row strides; w: [H].  r and sum may be NULL. */
void ls_rms_norm(const float *x, int64_t ldx, const float *r, int64_t ldr, float *sum, int64_t lds, int64_t rows,
                 int64_t H, const float *w, float eps, float *y, int64_t ldy) {
  for (int64_t i = 0; i < rows; i++) {
    const float *xi = x + i * ldx;
    float *yi = y + i * ldy;
    const float *s = xi;
    if (r) {
      float *si = sum + i * lds;
      const float *ri = r + i * ldr;
      for (int64_t d = 0; d < H; d++) si[d] = xi[d] + ri[d];
      s = si;
    }
    /* 16 partial sums (vectorised), added in a fixed tree */
    float acc[16] = {0};
    int64_t d = 0;
    for (; d + 16 <= H; d += 16)
      for (int j = 0; j < 16; j++) acc[j] += s[d + j] * s[d + j];
    for (; d < H; d++) acc[d & 15] += s[d] * s[d];
    for (int w2 = 8; w2 >= 1; w2 /= 2)
      for (int j = 0; j < w2; j++) acc[j] += acc[j + w2];
    float inv = 1.0f / sqrtf(acc[0] / (float)H + eps);
    for (d = 0; d < H; d++) yi[d] = w[d] * (s[d] * inv);
  }
}

/* x: [B, N, Q, D] by strides (last stride 1) -> out [B, N, Q, D] contiguous;
 * cos, sin: [B, Q, D] by strides (last 1).  D even. */
void ls_rotary(const float *x, int64_t B, int64_t N, int64_t Q, int64_t D, int64_t xsb, int64_t xsn, int64_t xsq,
               const float *cos_, const float *sin_, int64_t csb, int64_t csq, float *out) {
  int64_t half = D / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t q = 0; q < Q; q++) {
        const float *xi = x + b * xsb + n * xsn + q * xsq;
        const float *c = cos_ + b * csb + q * csq;
        const float *s = sin_ + b * csb + q * csq;
        float *o = out + ((b * N + n) * Q + q) * D;
        for (int64_t d = 0; d < half; d++) {
          float a = xi[d] * c[d];
          float e = (-xi[d + half]) * s[d];
          o[d] = a + e;
        }
        for (int64_t d = half; d < D; d++) {
          float a = xi[d] * c[d];
          float e = xi[d - half] * s[d];
          o[d] = a + e;
        }
      }
}
