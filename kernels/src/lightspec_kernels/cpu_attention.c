/* Attention of a few query tokens over a KV cache, on x86-64 CPUs (float32).
 *
 * Why: at batch 1 a decode step or a verify attends 1-16 new tokens to a few hundred
 * cached ones.  That is a few hundred thousand multiply-adds per layer, but PyTorch's CPU
 * scaled_dot_product_attention spends ~100 us per call on it (blocking, buffers and
 * threading built for long sequences): a quarter of a small model's decode step.
 *
 * For every (batch row b, query head h, query i): scores s_c = (q . k_c) * scale (+ an
 * additive mask) over the visible cache columns c, p = exp(s - max), out = sum p_c v_c /
 * sum p_c.  Key/value head of query head h: h / (H / H_kv) (grouped-query attention).
 * The arithmetic for one query does not depend on the other queries, on how the mask was
 * given (none, bool, or additive 0/-inf), or on the batch: a verify over q tokens gives
 * what one-token steps give.
 *
 * Visibility: with a bool mask, where it is nonzero; with an additive mask, where it is
 * above -inf and the score stays finite; with neither, causal when `causal` is set (query
 * i sees columns c <= i + C - Q, its own position and everything before), else every column.
 * A query that sees no column gets zeros.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"
#include "cpu_parallel.h"

typedef int32_t i16v __attribute__((vector_size(64)));

/* exp(x) for x <= 0 (scores minus their maximum): Cephes' expf polynomial after
 * x = n ln2 + r; below -87 (and -inf, a masked column) it is exactly 0. */
static inline v16 exp16(v16 x) {
  const v16 lo = splat(-87.0f);
  i16v dead = x < lo;
  x = (v16)(((i16v)x & ~dead) | ((i16v)lo & dead));
  v16 fx = x * splat(1.44269504088896341f) + splat(0.5f);
  v16 n;
  for (int j = 0; j < 16; j++) n[j] = __builtin_floorf(fx[j]);
  v16 r = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  v16 y = splat(1.9875691500e-4f);
  y = y * r + splat(1.3981999507e-3f);
  y = y * r + splat(8.3334519073e-3f);
  y = y * r + splat(4.1665795894e-2f);
  y = y * r + splat(1.6666665459e-1f);
  y = y * r + splat(5.0000001201e-1f);
  y = y * (r * r) + r + splat(1.0f);
  i16v e = __builtin_convertvector(n, i16v) + 127;
  e = e << 23;
  y = y * (v16)e;
  return (v16)((i16v)y & ~dead);
}

/* Sum of the 16 lanes as a fixed tree (the same order every time). */
static inline float hsum(v16 a) {
  a += __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  a += __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  a += __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  a += __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return a[0];
}

static inline float dot(const float *a, const float *b, int64_t D) {
  float s = 0.f;
  int64_t d = 0;
  if (D >= 32) {
    v16 acc0 = load16(a) * load16(b), acc1 = load16(a + 16) * load16(b + 16);
    for (d = 32; d + 32 <= D; d += 32) {
      acc0 += load16(a + d) * load16(b + d);
      acc1 += load16(a + d + 16) * load16(b + d + 16);
    }
    if (d + 16 <= D) {
      acc0 += load16(a + d) * load16(b + d);
      d += 16;
    }
    s = hsum(acc0 + acc1);
  } else if (D >= 16) {
    s = hsum(load16(a) * load16(b));
    d = 16;
  }
  for (; d < D; d++) s += a[d] * b[d];
  return s;
}

/* o[D] = sum_c p[c] v_c[D] * inv over c < n; column c always goes to accumulator c % 4, so
 * the sum's order depends only on the column, not on n (zero weights add exactly 0). */
static inline void weighted_sum(float *o, const float *p, const float *v, int64_t vsc, int64_t n, int64_t D,
                                float inv) {
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    v16 a0 = splat(0.f), a1 = splat(0.f), a2 = splat(0.f), a3 = splat(0.f);
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
      a0 += splat(p[c]) * load16(v + c * vsc + d);
      a1 += splat(p[c + 1]) * load16(v + (c + 1) * vsc + d);
      a2 += splat(p[c + 2]) * load16(v + (c + 2) * vsc + d);
      a3 += splat(p[c + 3]) * load16(v + (c + 3) * vsc + d);
    }
    if (c < n) a0 += splat(p[c]) * load16(v + c * vsc + d);
    if (c + 1 < n) a1 += splat(p[c + 1]) * load16(v + (c + 1) * vsc + d);
    if (c + 2 < n) a2 += splat(p[c + 2]) * load16(v + (c + 2) * vsc + d);
    v16 r = ((a0 + a1) + (a2 + a3)) * splat(inv);
    memcpy(o + d, &r, 64);
  }
  for (; d < D; d++) {
    float a[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t c = 0; c < n; c++) a[c & 3] += p[c] * v[c * vsc + d];
    o[d] = ((a[0] + a[1]) + (a[2] + a[3])) * inv;
  }
}

typedef struct {
  const float *q, *k, *v;
  int64_t B, H, Q, D, qsb, qsh, qsq, Hkv, C, ksb, ksh, ksc, vsb, vsh, vsc;
  const uint8_t *bmask;
  const float *fmask;
  int64_t msb, msh, msq, msc;
  int causal;
  float scale;
  float *out;
  int failed;
} attn_args;

/* Items [i0, i1) of the B x H (batch row, query head) pairs. */
static void attend_items(void *ctx, int64_t i0, int64_t i1) {
  attn_args *a = (attn_args *)ctx;
  const int64_t Q = a->Q, D = a->D, C = a->C, H = a->H, rep = a->H / a->Hkv;
  float *s = (float *)malloc((size_t)((C + 15) / 16 * 16 + 16) * sizeof(float));
  if (!s) {
    a->failed = 1;
    return;
  }
  for (int64_t item = i0; item < i1; item++) {
    const int64_t b = item / H, h = item % H;
    const float *kb = a->k + b * a->ksb + (h / rep) * a->ksh;
    const float *vb = a->v + b * a->vsb + (h / rep) * a->vsh;
    for (int64_t i = 0; i < Q; i++) {
      const float *qi = a->q + b * a->qsb + h * a->qsh + i * a->qsq;
      float *o = a->out + ((b * Q + i) * H + h) * D;
      int64_t visible_end = C; /* columns at or past this one are never visible (causal) */
      if (!a->bmask && !a->fmask && a->causal) visible_end = i + C - Q + 1;
      if (visible_end > C) visible_end = C;
      const uint8_t *brow = a->bmask ? a->bmask + b * a->msb + h * a->msh + i * a->msq : NULL;
      const float *frow = a->fmask ? a->fmask + b * a->msb + h * a->msh + i * a->msq : NULL;
      float m = -INFINITY;
      for (int64_t c = 0; c < visible_end; c++) {
        float sc;
        if (brow) {
          if (!brow[c * a->msc]) {
            s[c] = -INFINITY;
            continue;
          }
          sc = dot(qi, kb + c * a->ksc, D) * a->scale;
        } else if (frow) {
          float add = frow[c * a->msc];
          if (add == -INFINITY) {
            s[c] = -INFINITY;
            continue;
          }
          sc = dot(qi, kb + c * a->ksc, D) * a->scale + add;
        } else {
          sc = dot(qi, kb + c * a->ksc, D) * a->scale;
        }
        s[c] = sc;
        if (sc > m) m = sc;
      }
      if (m == -INFINITY) { /* nothing visible */
        memset(o, 0, (size_t)D * sizeof(float));
        continue;
      }
      for (int64_t c = visible_end; c < (visible_end + 15) / 16 * 16; c++) s[c] = -INFINITY;
      v16 total = splat(0.f);
      for (int64_t c = 0; c < visible_end; c += 16) {
        v16 p = exp16(load16(s + c) - splat(m));
        memcpy(s + c, &p, 64);
        total += p;
      }
      weighted_sum(o, s, vb, a->vsc, visible_end, D, 1.f / hsum(total));
    }
  }
  free(s);
}

/* q: [B, H, Q, D] by strides (last stride 1); k, v: [B, Hkv, C, D] likewise;
 * bmask (uint8) or fmask (float): [B, Hm, Q, C] by strides (0 where broadcast) or NULL;
 * out: [B, Q, H, D] contiguous.  Big calls (a prefill) split the (row, head) pairs over
 * `threads` threads.  Returns 0, or -1 when a score buffer cannot be allocated. */
int ls_attention(const float *q, int64_t B, int64_t H, int64_t Q, int64_t D, int64_t qsb, int64_t qsh, int64_t qsq,
                 const float *k, const float *v, int64_t Hkv, int64_t C, int64_t ksb, int64_t ksh, int64_t ksc,
                 int64_t vsb, int64_t vsh, int64_t vsc, const uint8_t *bmask, const float *fmask, int64_t msb,
                 int64_t msh, int64_t msq, int64_t msc, int causal, float scale, float *out, int threads) {
  attn_args a = {q, k, v, B, H, Q, D, qsb, qsh, qsq, Hkv, C, ksb, ksh, ksc, vsb, vsh, vsc,
                 bmask, fmask, msb, msh, msq, msc, causal, scale, out, 0};
  /* ~1 ms of work or more (query-key pairs x D) before a second thread pays */
  if ((double)B * H * Q * C * D < 3e7) threads = 1;
  ls_parallel(attend_items, &a, B * H, threads);
  return a.failed ? -1 : 0;
}
