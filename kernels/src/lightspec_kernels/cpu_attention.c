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

typedef int32_t vfi __attribute__((vector_size(LS_VW * 4)));
typedef uint8_t u8w __attribute__((vector_size(LS_VW)));

/* The arithmetic below is defined on 16-lane blocks (16 key columns, or 16 dimensions of a
 * head); a block is LS_VH machine vectors (one zmm with AVX-512, two ymm with AVX2), and
 * every lane computes the same operations in the same order either way. */
#define LS_VH (16 / LS_VW)

/* exp(x) for x <= 0 (scores minus their maximum): Cephes' expf polynomial after
 * x = n ln2 + r; below -87 (and -inf, a masked column) it is exactly 0. */
static inline vf expv(vf x) {
  const vf lo = splatv(-87.0f);
  vfi dead = x < lo;
  x = (vf)(((vfi)x & ~dead) | ((vfi)lo & dead));
  vf fx = x * splatv(1.44269504088896341f) + splatv(0.5f);
  vf n = fx; /* every lane is set below */
  for (int j = 0; j < LS_VW; j++) n[j] = __builtin_floorf(fx[j]);
  vf r = x - n * splatv(0.693359375f) - n * splatv(-2.12194440e-4f);
  vf y = splatv(1.9875691500e-4f);
  y = y * r + splatv(1.3981999507e-3f);
  y = y * r + splatv(8.3334519073e-3f);
  y = y * r + splatv(4.1665795894e-2f);
  y = y * r + splatv(1.6666665459e-1f);
  y = y * r + splatv(5.0000001201e-1f);
  y = y * (r * r) + r + splatv(1.0f);
  vfi e = __builtin_convertvector(n, vfi) + 127;
  e = e << 23;
  y = y * (vf)e;
  return (vf)((vfi)y & ~dead);
}

/* Sum of the 16 lanes of a block (a[0..LS_VH)) as a fixed tree: lanes l and l+8, then
 * l+4, l+2, l+1 (the same order every time, on either instruction set). */
static inline float hsum(const vf *a) {
#if LS_VW == 16
  vf x = a[0];
  x += __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  x += __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  x += __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  x += __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#else
  vf x = a[0] + a[1];
  x += __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3);
  x += __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5);
  x += __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6);
#endif
  return x[0];
}

static inline float dot(const float *a, const float *b, int64_t D) {
  float s = 0.f;
  int64_t d = 0;
  if (D >= 32) {
    vf acc0[LS_VH], acc1[LS_VH];
    for (int h = 0; h < LS_VH; h++) {
      acc0[h] = loadv(a + LS_VW * h) * loadv(b + LS_VW * h);
      acc1[h] = loadv(a + 16 + LS_VW * h) * loadv(b + 16 + LS_VW * h);
    }
    for (d = 32; d + 32 <= D; d += 32)
      for (int h = 0; h < LS_VH; h++) {
        acc0[h] += loadv(a + d + LS_VW * h) * loadv(b + d + LS_VW * h);
        acc1[h] += loadv(a + d + 16 + LS_VW * h) * loadv(b + d + 16 + LS_VW * h);
      }
    if (d + 16 <= D) {
      for (int h = 0; h < LS_VH; h++) acc0[h] += loadv(a + d + LS_VW * h) * loadv(b + d + LS_VW * h);
      d += 16;
    }
    for (int h = 0; h < LS_VH; h++) acc0[h] += acc1[h];
    s = hsum(acc0);
  } else if (D >= 16) {
    vf p[LS_VH];
    for (int h = 0; h < LS_VH; h++) p[h] = loadv(a + LS_VW * h) * loadv(b + LS_VW * h);
    s = hsum(p);
    d = 16;
  }
  for (; d < D; d++) s += a[d] * b[d];
  return s;
}

/* o[D] = sum_c p[c] v_c[D] * inv over c < n; column c always goes to accumulator c % 4 of
 * its dimension, so the sum's order depends only on the column, not on n (zero weights
 * add exactly 0) nor on how the dimensions are grouped into vectors. */
static inline void weighted_sum(float *o, const float *p, const float *v, int64_t vsc, int64_t n, int64_t D,
                                float inv) {
  int64_t d = 0;
  for (; d + LS_VW <= D; d += LS_VW) {
    vf a0 = splatv(0.f), a1 = splatv(0.f), a2 = splatv(0.f), a3 = splatv(0.f);
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
      a0 += splatv(p[c]) * loadv(v + c * vsc + d);
      a1 += splatv(p[c + 1]) * loadv(v + (c + 1) * vsc + d);
      a2 += splatv(p[c + 2]) * loadv(v + (c + 2) * vsc + d);
      a3 += splatv(p[c + 3]) * loadv(v + (c + 3) * vsc + d);
    }
    if (c < n) a0 += splatv(p[c]) * loadv(v + c * vsc + d);
    if (c + 1 < n) a1 += splatv(p[c + 1]) * loadv(v + (c + 1) * vsc + d);
    if (c + 2 < n) a2 += splatv(p[c + 2]) * loadv(v + (c + 2) * vsc + d);
    vf r = ((a0 + a1) + (a2 + a3)) * splatv(inv);
    memcpy(o + d, &r, sizeof r);
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

/* Scores of one query against 16 consecutive key columns, written to out[0..16), lane c =
 * column c0 + c, each what dot() computes for that column: the same lane-wise
 * multiply-adds over D, then the lanes of all 16 columns summed at once by a transposing
 * tree whose pairings are hsum()'s (lanes l and l+8, then l+4, l+2, l+1): one tree of
 * vector additions instead of 16 horizontal sums.  Columns n and above (n < 16: the cache
 * ends) read nothing and score 0.  Needs D % 32 == 0 (the caller checks). */
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#if LS_VW == 16
/* p[c]: the 16 lane sums of column c (one zmm each) */
static inline void tree16(float *out, vf (*p)[LS_VH]) {
  vf u[8], w[4], x[2];
  for (int j = 0; j < 8; j++)
    u[j] = SHUF(p[2 * j][0], p[2 * j + 1][0], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUF(p[2 * j][0], p[2 * j + 1][0], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int j = 0; j < 4; j++)
    w[j] = SHUF(u[2 * j], u[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           SHUF(u[2 * j], u[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int j = 0; j < 2; j++)
    x[j] = SHUF(w[2 * j], w[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           SHUF(w[2 * j], w[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  vf r = SHUF(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         SHUF(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  memcpy(out, &r, sizeof r);
}
#else
/* p[c]: lanes 0-7 and 8-15 of column c (two ymm each); each 8-column half is reduced by
 * its own tree after the (l, l+8) step */
static inline void tree16(float *out, vf (*p)[LS_VH]) {
  for (int half = 0; half < 2; half++) {
    vf u[8], w[4], x[2];
    for (int j = 0; j < 8; j++) u[j] = p[8 * half + j][0] + p[8 * half + j][1];
    for (int j = 0; j < 4; j++)
      w[j] = SHUF(u[2 * j], u[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11) + SHUF(u[2 * j], u[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int j = 0; j < 2; j++)
      x[j] = SHUF(w[2 * j], w[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13) + SHUF(w[2 * j], w[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    vf r = SHUF(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14) + SHUF(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15);
    memcpy(out + 8 * half, &r, sizeof r);
  }
}
#endif

/* One column's lane sums: slices of 16 dimensions alternate between two accumulators,
 * which are then added (as dot() does). */
static inline void column_lanes(vf *pc, const float *q, const float *kc, int64_t D) {
  vf acc0[LS_VH], acc1[LS_VH];
  for (int h = 0; h < LS_VH; h++) {
    acc0[h] = loadv(q + LS_VW * h) * loadv(kc + LS_VW * h);
    acc1[h] = loadv(q + 16 + LS_VW * h) * loadv(kc + 16 + LS_VW * h);
  }
  for (int64_t d = 32; d + 32 <= D; d += 32)
    for (int h = 0; h < LS_VH; h++) {
      acc0[h] += loadv(q + d + LS_VW * h) * loadv(kc + d + LS_VW * h);
      acc1[h] += loadv(q + d + 16 + LS_VW * h) * loadv(kc + d + 16 + LS_VW * h);
    }
  for (int h = 0; h < LS_VH; h++) pc[h] = acc0[h] + acc1[h];
}

/* dot16 for a head size fixed at compile time: the query stays in registers (with
 * AVX-512; with AVX2 a 64-float query is half the registers), the loops over D unroll, a
 * full block has no branch.  The same operations as column_lanes. */
#define DOT16(NAME, DD)                                                                  \
  static inline void NAME(float *out, const float *q, const float *k, int64_t ksc, int64_t n) { \
    vf qv[DD / LS_VW], p[16][LS_VH];                                                    \
    for (int j = 0; j < DD / LS_VW; j++) qv[j] = loadv(q + LS_VW * j);                  \
    _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) {                            \
      if (c < n) {                                                                      \
        const float *kc = k + c * ksc;                                                  \
        vf acc0[LS_VH], acc1[LS_VH];                                                    \
        for (int h = 0; h < LS_VH; h++) {                                               \
          acc0[h] = qv[h] * loadv(kc + LS_VW * h);                                      \
          acc1[h] = qv[LS_VH + h] * loadv(kc + 16 + LS_VW * h);                         \
        }                                                                               \
        for (int d = 32; d < DD; d += 32)                                               \
          for (int h = 0; h < LS_VH; h++) {                                             \
            acc0[h] += qv[d / LS_VW + h] * loadv(kc + d + LS_VW * h);                   \
            acc1[h] += qv[(d + 16) / LS_VW + h] * loadv(kc + d + 16 + LS_VW * h);       \
          }                                                                             \
        for (int h = 0; h < LS_VH; h++) p[c][h] = acc0[h] + acc1[h];                    \
      } else {                                                                          \
        for (int h = 0; h < LS_VH; h++) p[c][h] = splatv(0.f);                          \
      }                                                                                 \
    }                                                                                   \
    tree16(out, p);                                                                     \
  }
DOT16(dot16_64, 64)
DOT16(dot16_128, 128)

static inline void dot16(float *out, const float *q, const float *k, int64_t ksc, int64_t D, int64_t n) {
  if (D == 64) return dot16_64(out, q, k, ksc, n);
  if (D == 128) return dot16_128(out, q, k, ksc, n);
  vf p[16][LS_VH];
  for (int c = 0; c < 16; c++) {
    if (c < n)
      column_lanes(p[c], q, k + c * ksc, D);
    else
      for (int h = 0; h < LS_VH; h++) p[c][h] = splatv(0.f);
  }
  tree16(out, p);
}

/* Scale, mask and soft-max one query's raw scores s[0, visible_end) in place: s becomes
 * exp(score - max) with -inf (then 0) for hidden columns, padded with zeros to a multiple
 * of 16.  Returns 1 / sum, or 0 when no column is visible. */
static inline float softmax_row(const attn_args *a, float *s, int64_t visible_end, const uint8_t *brow,
                                const float *frow) {
  float m = -INFINITY;
  int64_t c = 0;
  if (!frow && (!brow || a->msc == 1)) { /* scale, mask and running maximum, a vector at a time (max is exact) */
    vf mv = splatv(-INFINITY), sv = splatv(a->scale);
    const vfi hidden = (vfi)splatv(-INFINITY);
    for (; c + LS_VW <= visible_end; c += LS_VW) {
      vf x = loadv(s + c) * sv;
      if (brow) {
        u8w mb;
        memcpy(&mb, brow + c, sizeof mb);
        vfi vis = __builtin_convertvector(mb, vfi) != 0;
        x = (vf)(((vfi)x & vis) | (hidden & ~vis));
      }
      memcpy(s + c, &x, sizeof x);
      vfi gt = x > mv;
      mv = (vf)(((vfi)x & gt) | ((vfi)mv & ~gt));
    }
    for (int j = 0; j < LS_VW; j++)
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
  /* the sum: lane l of a 16-lane block takes columns l, l + 16, ... */
  vf total[LS_VH];
  for (int h = 0; h < LS_VH; h++) total[h] = splatv(0.f);
  for (c = 0; c < visible_end; c += 16)
    for (int h = 0; h < LS_VH; h++) {
      vf p = expv(loadv(s + c + LS_VW * h) - splatv(m));
      memcpy(s + c + LS_VW * h, &p, sizeof p);
      total[h] += p;
    }
  return 1.f / hsum(total);
}

/* acc[SV][4] (SV = D / LS_VW vectors of dimensions, 4 accumulators each) += the n columns
 * of one 16-column block: column t (of the block, which starts at a multiple of 16) goes to
 * accumulator t % 4 of every dimension, as in weighted_sum, so each accumulator sees the
 * same sequence of multiply-adds whichever way the columns are grouped into calls. */
#if LS_VW == 16
#define JB 4 /* vectors of dimensions at a time: 16 independent chains in 32 zmm */
#else
#define JB 2 /* 8 chains in 16 ymm */
#endif
static inline void accumulate(vf *acc, const float *p, const float *v, int64_t vsc, int64_t n, int64_t SV) {
  int64_t j = 0;
  for (; j + JB <= SV; j += JB) {
    vf r[JB][4];
    for (int jj = 0; jj < JB; jj++)
      for (int g = 0; g < 4; g++) r[jj][g] = acc[(j + jj) * 4 + g];
    int64_t t = 0;
    for (; t + 4 <= n; t += 4)
      for (int g = 0; g < 4; g++) {
        vf pc = splatv(p[t + g]);
        const float *vc = v + (t + g) * vsc + LS_VW * j;
        for (int jj = 0; jj < JB; jj++) r[jj][g] += pc * loadv(vc + LS_VW * jj);
      }
    for (int g = 0; g < 3; g++)
      if (t + g < n) {
        vf pc = splatv(p[t + g]);
        const float *vc = v + (t + g) * vsc + LS_VW * j;
        for (int jj = 0; jj < JB; jj++) r[jj][g] += pc * loadv(vc + LS_VW * jj);
      }
    for (int jj = 0; jj < JB; jj++)
      for (int g = 0; g < 4; g++) acc[(j + jj) * 4 + g] = r[jj][g];
  }
  for (; j < SV; j++) {
    vf r0 = acc[j * 4], r1 = acc[j * 4 + 1], r2 = acc[j * 4 + 2], r3 = acc[j * 4 + 3];
    const float *vj = v + LS_VW * j;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
      r0 += splatv(p[t]) * loadv(vj + t * vsc);
      r1 += splatv(p[t + 1]) * loadv(vj + (t + 1) * vsc);
      r2 += splatv(p[t + 2]) * loadv(vj + (t + 2) * vsc);
      r3 += splatv(p[t + 3]) * loadv(vj + (t + 3) * vsc);
    }
    if (t < n) r0 += splatv(p[t]) * loadv(vj + t * vsc);
    if (t + 1 < n) r1 += splatv(p[t + 1]) * loadv(vj + (t + 1) * vsc);
    if (t + 2 < n) r2 += splatv(p[t + 2]) * loadv(vj + (t + 2) * vsc);
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
  const int64_t Cp = (C + 15) / 16 * 16 + 16, SV = D / LS_VW;
  const int blocked = D % 32 == 0;
  const int64_t qb = blocked ? QB : 1;
  float *s = (float *)malloc((size_t)(qb * Cp) * sizeof(float));
  vf *acc = blocked ? (vf *)aligned_alloc(64, (size_t)(QB * SV * 4) * sizeof(vf)) : NULL;
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
            dot16(sr + c0, qi, kb + c0 * a->ksc, a->ksc, D, n);
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
      for (int64_t x = 0; x < nq * SV * 4; x++) acc[x] = splatv(0.f);
      for (int64_t c0 = 0; c0 < most; c0 += 16)
        for (int64_t r = 0; r < nq; r++) {
          if (c0 >= vend[r]) continue;
          int64_t n = vend[r] - c0 < 16 ? vend[r] - c0 : 16;
          accumulate(acc + r * SV * 4, s + r * Cp + c0, vb + c0 * a->vsc, a->vsc, n, SV);
        }
      for (int64_t r = 0; r < nq; r++) {
        if (!vend[r]) continue;
        float *o = a->out + ((b * Q + q0 + r) * H + h) * D;
        const vf *ar = acc + r * SV * 4;
        for (int64_t j = 0; j < SV; j++) {
          vf res = ((ar[j * 4] + ar[j * 4 + 1]) + (ar[j * 4 + 2] + ar[j * 4 + 3])) * splatv(inv[r]);
          memcpy(o + LS_VW * j, &res, sizeof res);
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
