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
 * Memory: with head size a multiple of 32, up to 16 queries of one head are done together,
 * block of 16 key columns by block, so a verify reads each key and value from memory once,
 * not once per query (on the zoo target, 8 queries over 408 columns: 136 -> 105 us a layer).
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
typedef uint8_t u8v __attribute__((vector_size(16)));

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

/* o[D] = sum_c p[c] v_c[D] * inv over c < n; column c always goes to accumulator c % 4 of
 * its 16-wide slice of D, so the sum's order depends only on the column, not on n (zero
 * weights add exactly 0).  Four slices at a time (16 independent accumulators keep both
 * multiply-add units busy), then single slices; every accumulator sees the same sequence
 * either way. */
static inline void weighted_sum(float *o, const float *p, const float *v, int64_t vsc, int64_t n, int64_t D,
                                float inv) {
  int64_t d = 0;
  for (; d + 64 <= D; d += 64) {
    v16 a[4][4];
    for (int j = 0; j < 4; j++)
      for (int g = 0; g < 4; g++) a[j][g] = splat(0.f);
    int64_t c = 0;
    for (; c + 4 <= n; c += 4)
      for (int g = 0; g < 4; g++) {
        v16 pc = splat(p[c + g]);
        const float *vc = v + (c + g) * vsc + d;
        for (int j = 0; j < 4; j++) a[j][g] += pc * load16(vc + 16 * j);
      }
    for (int g = 0; g < 3; g++)
      if (c + g < n) {
        v16 pc = splat(p[c + g]);
        const float *vc = v + (c + g) * vsc + d;
        for (int j = 0; j < 4; j++) a[j][g] += pc * load16(vc + 16 * j);
      }
    for (int j = 0; j < 4; j++) {
      v16 r = ((a[j][0] + a[j][1]) + (a[j][2] + a[j][3])) * splat(inv);
      memcpy(o + d + 16 * j, &r, 64);
    }
  }
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

/* Scores of one query against 16 consecutive key columns, lane c = column c0 + c, each
 * what dot() computes for that column: the same lane-wise multiply-adds over D, then the
 * lanes of all 16 columns summed at once by a transposing tree whose pairings are
 * hsum()'s (lanes l and l+8, then l+4, l+2, l+1): one tree of 15 vector additions instead
 * of 16 horizontal sums.  Columns n and above (n < 16: the cache ends) read nothing and
 * score 0.  Needs D % 32 == 0 (the caller checks). */
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
static inline v16 tree16(const v16 *p) {
  v16 u[8], w[4], x[2];
  for (int j = 0; j < 8; j++)
    u[j] = SHUF(p[2 * j], p[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUF(p[2 * j], p[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int j = 0; j < 4; j++)
    w[j] = SHUF(u[2 * j], u[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           SHUF(u[2 * j], u[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int j = 0; j < 2; j++)
    x[j] = SHUF(w[2 * j], w[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           SHUF(w[2 * j], w[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return SHUF(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         SHUF(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* dot16 for a head size fixed at compile time: the query stays in registers, the 16
 * columns are unrolled (a full block has no branch). */
#define DOT16(NAME, DD)                                                                  \
  static inline v16 NAME(const float *q, const float *k, int64_t ksc, int64_t n) {      \
    v16 qv[DD / 16], p[16];                                                             \
    for (int j = 0; j < DD / 16; j++) qv[j] = load16(q + 16 * j);                       \
    _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) {                            \
      if (c < n) {                                                                      \
        const float *kc = k + c * ksc;                                                  \
        v16 acc0 = qv[0] * load16(kc), acc1 = qv[1] * load16(kc + 16);                  \
        for (int j = 2; j < DD / 16; j += 2) {                                          \
          acc0 += qv[j] * load16(kc + 16 * j);                                          \
          acc1 += qv[j + 1] * load16(kc + 16 * j + 16);                                 \
        }                                                                               \
        p[c] = acc0 + acc1;                                                             \
      } else {                                                                          \
        p[c] = splat(0.f);                                                              \
      }                                                                                 \
    }                                                                                   \
    return tree16(p);                                                                   \
  }
DOT16(dot16_64, 64)
DOT16(dot16_128, 128)

static inline v16 dot16(const float *q, const float *k, int64_t ksc, int64_t D, int64_t n) {
  if (D == 64) return dot16_64(q, k, ksc, n);
  if (D == 128) return dot16_128(q, k, ksc, n);
  v16 p[16];
  for (int c = 0; c < 16; c++) {
    if (c >= n) {
      p[c] = splat(0.f);
      continue;
    }
    const float *kc = k + c * ksc;
    v16 acc0 = load16(q) * load16(kc), acc1 = load16(q + 16) * load16(kc + 16);
    for (int64_t d = 32; d + 32 <= D; d += 32) {
      acc0 += load16(q + d) * load16(kc + d);
      acc1 += load16(q + d + 16) * load16(kc + d + 16);
    }
    p[c] = acc0 + acc1;
  }
  return tree16(p);
}

/* Scale, mask and soft-max one query's raw scores s[0, visible_end) in place: s becomes
 * exp(score - max) with -inf (then 0) for hidden columns, padded with zeros to a multiple
 * of 16.  Returns 1 / sum, or 0 when no column is visible. */
static inline float softmax_row(const attn_args *a, float *s, int64_t visible_end, const uint8_t *brow,
                                const float *frow) {
  float m = -INFINITY;
  int64_t c = 0;
  if (!frow && (!brow || a->msc == 1)) { /* scale, mask and running maximum, 16 lanes at a time (max is exact) */
    v16 mv = splat(-INFINITY), sv = splat(a->scale);
    const i16v hidden = (i16v)splat(-INFINITY);
    for (; c + 16 <= visible_end; c += 16) {
      v16 x = load16(s + c) * sv;
      if (brow) {
        u8v mb;
        memcpy(&mb, brow + c, 16);
        i16v vis = __builtin_convertvector(mb, i16v) != 0;
        x = (v16)(((i16v)x & vis) | (hidden & ~vis));
      }
      memcpy(s + c, &x, 64);
      i16v gt = x > mv;
      mv = (v16)(((i16v)x & gt) | ((i16v)mv & ~gt));
    }
    for (int j = 0; j < 16; j++)
      if (mv[j] > m) m = mv[j];
  }
  for (; c < visible_end; c++) {
    float sc;
    if (brow) {
      if (!brow[c * a->msc]) {
        s[c] = -INFINITY;
        continue;
      }
      sc = s[c] * a->scale;
    } else if (frow) {
      float add = frow[c * a->msc];
      if (add == -INFINITY) {
        s[c] = -INFINITY;
        continue;
      }
      sc = s[c] * a->scale + add;
    } else {
      sc = s[c] * a->scale;
    }
    s[c] = sc;
    if (sc > m) m = sc;
  }
  if (m == -INFINITY) return 0.f;
  for (c = visible_end; c < (visible_end + 15) / 16 * 16; c++) s[c] = -INFINITY;
  v16 total = splat(0.f);
  for (c = 0; c < visible_end; c += 16) {
    v16 p = exp16(load16(s + c) - splat(m));
    memcpy(s + c, &p, 64);
    total += p;
  }
  return 1.f / hsum(total);
}

/* acc[S][4] (S = D / 16 slices of 16, 4 accumulators each) += the n columns of one
 * 16-column block: column t (of the block, which starts at a multiple of 16) goes to
 * accumulator t % 4 of every slice, as in weighted_sum, so each accumulator sees the
 * same sequence of multiply-adds whichever way the columns are grouped into calls. */
static inline void accumulate(v16 *acc, const float *p, const float *v, int64_t vsc, int64_t n, int64_t S) {
  int64_t j = 0;
  for (; j + 4 <= S; j += 4) { /* 4 slices: 16 independent chains */
    v16 r[4][4];
    for (int jj = 0; jj < 4; jj++)
      for (int g = 0; g < 4; g++) r[jj][g] = acc[(j + jj) * 4 + g];
    int64_t t = 0;
    for (; t + 4 <= n; t += 4)
      for (int g = 0; g < 4; g++) {
        v16 pc = splat(p[t + g]);
        const float *vc = v + (t + g) * vsc + 16 * j;
        for (int jj = 0; jj < 4; jj++) r[jj][g] += pc * load16(vc + 16 * jj);
      }
    for (int g = 0; g < 3; g++)
      if (t + g < n) {
        v16 pc = splat(p[t + g]);
        const float *vc = v + (t + g) * vsc + 16 * j;
        for (int jj = 0; jj < 4; jj++) r[jj][g] += pc * load16(vc + 16 * jj);
      }
    for (int jj = 0; jj < 4; jj++)
      for (int g = 0; g < 4; g++) acc[(j + jj) * 4 + g] = r[jj][g];
  }
  for (; j < S; j++) {
    v16 r0 = acc[j * 4], r1 = acc[j * 4 + 1], r2 = acc[j * 4 + 2], r3 = acc[j * 4 + 3];
    const float *vj = v + 16 * j;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
      r0 += splat(p[t]) * load16(vj + t * vsc);
      r1 += splat(p[t + 1]) * load16(vj + (t + 1) * vsc);
      r2 += splat(p[t + 2]) * load16(vj + (t + 2) * vsc);
      r3 += splat(p[t + 3]) * load16(vj + (t + 3) * vsc);
    }
    if (t < n) r0 += splat(p[t]) * load16(vj + t * vsc);
    if (t + 1 < n) r1 += splat(p[t + 1]) * load16(vj + (t + 1) * vsc);
    if (t + 2 < n) r2 += splat(p[t + 2]) * load16(vj + (t + 2) * vsc);
    acc[j * 4] = r0, acc[j * 4 + 1] = r1, acc[j * 4 + 2] = r2, acc[j * 4 + 3] = r3;
  }
}

/* Queries handled together: each 16-column block of keys and values is read from memory
 * once for all of them (then from the L1 cache), instead of once per query. */
#define QB 16

/* Items [i0, i1) of the B x H (batch row, query head) pairs. */
static void attend_items(void *ctx, int64_t i0, int64_t i1) {
  attn_args *a = (attn_args *)ctx;
  const int64_t Q = a->Q, D = a->D, C = a->C, H = a->H, rep = a->H / a->Hkv;
  const int64_t Cp = (C + 15) / 16 * 16 + 16, S = D / 16;
  const int blocked = D % 32 == 0;
  const int64_t qb = blocked ? QB : 1;
  float *s = (float *)malloc((size_t)(qb * Cp) * sizeof(float));
  v16 *acc = blocked ? (v16 *)aligned_alloc(64, (size_t)(QB * S * 4) * sizeof(v16)) : NULL;
  if (!s || (blocked && !acc)) {
    a->failed = 1;
    free(s);
    free(acc);
    return;
  }
  int64_t vend[QB];
  float inv[QB];
  for (int64_t item = i0; item < i1; item++) {
    const int64_t b = item / H, h = item % H;
    const float *kb = a->k + b * a->ksb + (h / rep) * a->ksh;
    const float *vb = a->v + b * a->vsb + (h / rep) * a->vsh;
    for (int64_t q0 = 0; q0 < Q; q0 += qb) {
      const int64_t nq = Q - q0 < qb ? Q - q0 : qb;
      int64_t most = 0;
      for (int64_t r = 0; r < nq; r++) {
        const int64_t i = q0 + r;
        int64_t e = C; /* columns at or past this one are never visible (causal) */
        if (!a->bmask && !a->fmask && a->causal) e = i + C - Q + 1;
        if (e > C) e = C;
        /* with a mask: up to its last visible column (a causal mask as a bool tensor, as a
         * prefill passes it, then costs what the causal flag costs; hidden columns past it
         * would only add exact zeros) */
        if (a->bmask) {
          const uint8_t *brow = a->bmask + b * a->msb + h * a->msh + i * a->msq;
          while (e > 0 && !brow[(e - 1) * a->msc]) e--;
        } else if (a->fmask) {
          const float *frow = a->fmask + b * a->msb + h * a->msh + i * a->msq;
          while (e > 0 && frow[(e - 1) * a->msc] == -INFINITY) e--;
        }
        vend[r] = e;
        if (vend[r] > most) most = vend[r];
      }
      /* raw scores q . k, block by block of 16 columns, every query of the group per block */
      for (int64_t c0 = 0; c0 < most; c0 += 16)
        for (int64_t r = 0; r < nq; r++) {
          if (c0 >= vend[r]) continue;
          const float *qi = a->q + b * a->qsb + h * a->qsh + (q0 + r) * a->qsq;
          float *sr = s + r * Cp;
          if (blocked) {
            int64_t n = vend[r] - c0 < 16 ? vend[r] - c0 : 16;
            v16 sc = dot16(qi, kb + c0 * a->ksc, a->ksc, D, n);
            memcpy(sr + c0, &sc, 64);
          } else {
            int64_t end = c0 + 16 < vend[r] ? c0 + 16 : vend[r];
            for (int64_t c = c0; c < end; c++) sr[c] = dot(qi, kb + c * a->ksc, D);
          }
        }
      for (int64_t r = 0; r < nq; r++) {
        const int64_t i = q0 + r;
        const uint8_t *brow = a->bmask ? a->bmask + b * a->msb + h * a->msh + i * a->msq : NULL;
        const float *frow = a->fmask ? a->fmask + b * a->msb + h * a->msh + i * a->msq : NULL;
        inv[r] = softmax_row(a, s + r * Cp, vend[r], brow, frow);
        if (inv[r] == 0.f) { /* nothing visible */
          memset(a->out + ((b * Q + i) * H + h) * D, 0, (size_t)D * sizeof(float));
          vend[r] = 0;
        } else if (!blocked) {
          weighted_sum(a->out + ((b * Q + i) * H + h) * D, s + r * Cp, vb, a->vsc, vend[r], D, inv[r]);
        }
      }
      if (!blocked) continue;
      /* weighted sums of the values, block by block, every query of the group per block */
      for (int64_t x = 0; x < nq * S * 4; x++) acc[x] = splat(0.f);
      for (int64_t c0 = 0; c0 < most; c0 += 16)
        for (int64_t r = 0; r < nq; r++) {
          if (c0 >= vend[r]) continue;
          int64_t n = vend[r] - c0 < 16 ? vend[r] - c0 : 16;
          accumulate(acc + r * S * 4, s + r * Cp + c0, vb + c0 * a->vsc, a->vsc, n, S);
        }
      for (int64_t r = 0; r < nq; r++) {
        if (!vend[r]) continue;
        float *o = a->out + ((b * Q + q0 + r) * H + h) * D;
        const v16 *ar = acc + r * S * 4;
        for (int64_t j = 0; j < S; j++) {
          v16 res = ((ar[j * 4] + ar[j * 4 + 1]) + (ar[j * 4 + 2] + ar[j * 4 + 3])) * splat(inv[r]);
          memcpy(o + 16 * j, &res, 64);
        }
      }
    }
  }
  free(s);
  free(acc);
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
