/* y = x @ W.T (+ bias) for small row counts on x86-64 CPUs, with W pre-packed.
 *
 * Why: at batch 1 a decode step or a verify over a few tokens is a product of a few rows
 * by every weight of the model, and on the CPU the BLAS reads the weights slowly at that
 * shape (it packs them on every call).  Here the weights are packed once, at load, as
 * column blocks of 16 outputs ([N/16][K][16], float16 or float32), so that one pass reads
 * each weight once, in order, and multiplies it into up to 8 rows held in registers.
 * float16 storage halves the bytes read; it is used only when the float32 weights are
 * exactly float16 values (a model stored in float16), so the products are unchanged.
 *
 * Numerics: every output is one fused multiply-add chain over k = 0..K-1 starting from
 * 0, then + bias.  The chain does not depend on how many rows are computed together, so a
 * row's result is the same bit for bit whatever M is (a verify over q tokens gives the
 * logits a one-token step gives).
 *
 * Build: cc -O3 -march=native -ffp-contract=fast -shared -fPIC (lightspec_kernels.cpu_linear
 * compiles it on first use).  The 64-byte vectors are GCC vector extensions: one zmm
 * register with AVX-512, two ymm registers with AVX2.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"
#include "cpu_parallel.h"

/* A 16-output column block is LS_VH machine vectors (1 with AVX-512, 2 with AVX2). */
#define LS_VH (16 / LS_VW)

/* Lanes h*LS_VW .. h*LS_VW + LS_VW - 1 of a 16-value block, as floats. */
static inline vf load_f16(const uint16_t *p, int h) {
#if defined(__AVX512F__)
  (void)h;
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8 * h)));
#endif
}

static inline vf load_f32(const float *p, int h) { return loadv(p + LS_VW * h); }

/* Store lanes of part h of a block whose valid outputs, from the block's start, are `n`. */
static inline void store(float *y, vf v, int h, int64_t n) {
  int64_t room = n - (int64_t)h * LS_VW;
  if (room >= LS_VW)
    memcpy(y + h * LS_VW, &v, sizeof v);
  else if (room > 0)
    memcpy(y + h * LS_VW, &v, (size_t)room * 4);
}

/* One register tile: MT rows of x times NT column blocks of W, accumulated over all of K.
 * Each output lane is acc = x[k] * w[k] + acc for k = 0..K-1 from 0, whatever the tile or
 * the vector width, so every tile gives the same bits. */
#define TILE(NAME, WT, LOAD, MT, NT)                                                         \
  static void NAME(const float *x, int64_t ldx, int64_t K, const WT *w, const float *bias,   \
                   float *y, int64_t ldy, int64_t nb0, int64_t N) {                          \
    vf acc[MT][NT * LS_VH];                                                                  \
    const WT *wb[NT];                                                                        \
    for (int j = 0; j < NT; j++) wb[j] = w + (nb0 + j) * K * 16;                             \
    for (int i = 0; i < MT; i++)                                                             \
      for (int j = 0; j < NT * LS_VH; j++) acc[i][j] = splatv(0.f);                          \
    for (int64_t k = 0; k < K; k++) {                                                        \
      vf wv[NT * LS_VH];                                                                     \
      for (int j = 0; j < NT; j++)                                                           \
        for (int h = 0; h < LS_VH; h++) wv[j * LS_VH + h] = LOAD(wb[j] + k * 16, h);         \
      for (int i = 0; i < MT; i++) {                                                         \
        vf xb = splatv(x[i * ldx + k]);                                                      \
        for (int j = 0; j < NT * LS_VH; j++) acc[i][j] += xb * wv[j];                        \
      }                                                                                      \
    }                                                                                        \
    for (int j = 0; j < NT; j++) {                                                           \
      int64_t col = (nb0 + j) * 16;                                                          \
      float tmp[16] = {0};                                                                   \
      if (bias) memcpy(tmp, bias + col, (size_t)(N - col < 16 ? N - col : 16) * 4);          \
      for (int h = 0; h < LS_VH; h++) {                                                      \
        vf b = loadv(tmp + h * LS_VW);                                                       \
        for (int i = 0; i < MT; i++)                                                         \
          store(y + i * ldy + col, bias ? acc[i][j * LS_VH + h] + b : acc[i][j * LS_VH + h], h, N - col); \
      }                                                                                      \
    }                                                                                        \
  }

/* Row-tile sizes and the column blocks each takes at once: enough independent
 * accumulators to hide the FMA latency, few enough to stay in the vector registers.
 * AVX-512 (32 zmm, a block is one register): the 8 x 3 tile (24 accumulators, 11 loads per
 * 24 multiply-adds) carries a prefill: on the 2-core VM it made 256-row products 13%
 * faster than 8 x 2.  AVX2 (16 ymm, a block is two): tiles of at most 4 rows; on a Zen 3
 * VM 4 x 2 (16 accumulators) ran at 25 G multiply-adds/s, 6 x 1 and 8 x 1 at 23 and 21.
 * That counts registers for float32 weights, which the multiply-adds read straight from
 * memory.  float16 weights are converted into registers first, and 4 x 2 then needs 16
 * accumulators + 4 converted weights + 1 broadcast = 21 of the 16 registers: GCC kept 5
 * accumulators on the stack and moved them through memory on every k.  So float16 weights
 * take one block per tile from 2 rows on (4 x 1: 8 + 2 + 1 = 11 registers): on a Zen 4 VM
 * (AVX2 only), measured in one process on the zoo target's own weights, the products of
 * 4, 8, 16 and 64 rows took 0.76, 0.73, 0.69 and 0.66 of the time of 4 x 2, and 2 x 1 took
 * 0.70-0.77 of 2 x 2 (1 x 4 stayed the fastest for one row).  WIDE and WIDE_NT take the
 * weight type.  With AVX-512 every height from 1 to 8 has its own tile (5 x 3 and 7 x 3: 15
 * and 21 accumulators): without them 5 rows ran as 4 + 1 and 7 as 6 + 1, and the one-row
 * pass over every weight made a verify of 5 (7) slots dearer than one of 6 (8)
 * (docs/kernels.md, "Row tiles"). */
#if defined(__AVX512F__)
#define LS_MAX_ROWS 8
#define TILES(SFX, WT, LOAD)                 \
  TILE(t1_4_##SFX, WT, LOAD, 1, 4)           \
  TILE(t2_4_##SFX, WT, LOAD, 2, 4)           \
  TILE(t3_4_##SFX, WT, LOAD, 3, 4)           \
  TILE(t4_4_##SFX, WT, LOAD, 4, 4)           \
  TILE(t5_3_##SFX, WT, LOAD, 5, 3)           \
  TILE(t6_2_##SFX, WT, LOAD, 6, 2)           \
  TILE(t7_3_##SFX, WT, LOAD, 7, 3)           \
  TILE(t8_3_##SFX, WT, LOAD, 8, 3)           \
  TILE(t1_1_##SFX, WT, LOAD, 1, 1)           \
  TILE(t2_1_##SFX, WT, LOAD, 2, 1)           \
  TILE(t3_1_##SFX, WT, LOAD, 3, 1)           \
  TILE(t4_1_##SFX, WT, LOAD, 4, 1)           \
  TILE(t5_1_##SFX, WT, LOAD, 5, 1)           \
  TILE(t6_1_##SFX, WT, LOAD, 6, 1)           \
  TILE(t7_1_##SFX, WT, LOAD, 7, 1)           \
  TILE(t8_1_##SFX, WT, LOAD, 8, 1)
#define WIDE(SFX) {0, t1_4_##SFX, t2_4_##SFX, t3_4_##SFX, t4_4_##SFX, t5_3_##SFX, t6_2_##SFX, t7_3_##SFX, t8_3_##SFX}
#define WIDE_NT_f16 {0, 4, 4, 4, 4, 3, 2, 3, 3}
#define WIDE_NT_f32 WIDE_NT_f16
#define NARROW(SFX) {0, t1_1_##SFX, t2_1_##SFX, t3_1_##SFX, t4_1_##SFX, t5_1_##SFX, t6_1_##SFX, t7_1_##SFX, t8_1_##SFX}
#else
#define LS_MAX_ROWS 4
#define TILES(SFX, WT, LOAD)                 \
  TILE(t1_4_##SFX, WT, LOAD, 1, 4)           \
  TILE(t3_1_##SFX, WT, LOAD, 3, 1)           \
  TILE(t1_1_##SFX, WT, LOAD, 1, 1)           \
  TILE(t2_1_##SFX, WT, LOAD, 2, 1)           \
  TILE(t4_1_##SFX, WT, LOAD, 4, 1)           \
  TILES_WIDE_##SFX(WT, LOAD)
#define TILES_WIDE_f16(WT, LOAD)
#define TILES_WIDE_f32(WT, LOAD)             \
  TILE(t2_2_f32, WT, LOAD, 2, 2)             \
  TILE(t4_2_f32, WT, LOAD, 4, 2)
#define WIDE_f16 {0, t1_4_f16, t2_1_f16, t3_1_f16, t4_1_f16, 0, 0, 0, 0}
#define WIDE_f32 {0, t1_4_f32, t2_2_f32, t3_1_f32, t4_2_f32, 0, 0, 0, 0}
#define WIDE(SFX) WIDE_##SFX
#define WIDE_NT_f16 {0, 4, 1, 1, 1, 0, 0, 0, 0}
#define WIDE_NT_f32 {0, 4, 2, 1, 2, 0, 0, 0, 0}
#define NARROW(SFX) {0, t1_1_##SFX, t2_1_##SFX, t3_1_##SFX, t4_1_##SFX, 0, 0, 0, 0}
#endif

TILES(f16, uint16_t, load_f16)
TILES(f32, float, load_f32)

/* Column blocks are the outer loop, rows the inner one: a strip of 12 column blocks of W
 * (12 x K x 16 values, 384 KB for K = 1024 in float16) is read from memory once and then reused from the
 * L2 cache for every row tile; each row tile walks the strip as wide as its tile allows.
 * Strips are independent: big calls split them over `threads` threads. */
#define STRIP 12
#define DRIVER(SFX, WT)                                                                                    \
  typedef struct {                                                                                      \
    const float *x;                                                                                     \
    int64_t M, K, ldx;                                                                                  \
    const WT *w;                                                                                        \
    int64_t N;                                                                                          \
    const float *bias;                                                                                  \
    float *y;                                                                                           \
    int64_t ldy;                                                                                        \
  } args_##SFX;                                                                                         \
  static void strips_##SFX(void *ctx, int64_t s0, int64_t s1) {                                         \
    const args_##SFX *a = (const args_##SFX *)ctx;                                                      \
    const float *x = a->x, *bias = a->bias;                                                             \
    const WT *w = a->w;                                                                                 \
    float *y = a->y;                                                                                    \
    int64_t M = a->M, K = a->K, ldx = a->ldx, N = a->N, ldy = a->ldy;                                   \
    int64_t NB = (N + 15) / 16;                                                                         \
    /* per row-tile height: the widest tile (and its width in blocks), and the one-block tile */     \
    typedef void (*tile)(const float *, int64_t, int64_t, const WT *, const float *, float *, int64_t,  \
                         int64_t, int64_t);                                                             \
    static const tile wide[9] = WIDE(SFX);                                                              \
    static const int wide_nt[9] = WIDE_NT_##SFX;                                                        \
    static const tile narrow[9] = NARROW(SFX);                                                          \
    for (int64_t nb = s0 * STRIP; nb < NB && nb < s1 * STRIP; nb += STRIP) {                            \
      int64_t last = nb + STRIP < NB ? nb + STRIP : NB;                                                 \
      for (int64_t m = 0; m < M;) {                                                                     \
        int64_t r = M - m;                                                                              \
        const float *xm = x + m * ldx;                                                                  \
        float *ym = y + m * ldy;                                                                        \
        int mt = LS_MAX_ROWS >= 8 ? (r >= 8 ? 8 : (int)r) : r >= 4 ? 4 : r >= 3 ? 3 : r >= 2 ? 2 : 1; \
        int64_t b = nb;                                                                                 \
        for (; b + wide_nt[mt] <= last; b += wide_nt[mt]) wide[mt](xm, ldx, K, w, bias, ym, ldy, b, N);  \
        for (; b < last; b++) narrow[mt](xm, ldx, K, w, bias, ym, ldy, b, N);                           \
        m += mt;                                                                                        \
      }                                                                                                 \
    }                                                                                                   \
  }                                                                                                     \
  void ls_linear_##SFX(const float *x, int64_t M, int64_t K, int64_t ldx, const WT *w, int64_t N,         \
                       const float *bias, float *y, int64_t ldy, int threads) {                         \
    args_##SFX a = {x, M, K, ldx, w, N, bias, y, ldy};                                                  \
    int64_t strips = ((N + 15) / 16 + STRIP - 1) / STRIP;                                               \
    /* below ~30M multiply-adds (~1 ms) starting threads costs more than it saves */                 \
    if ((double)M * (double)N * (double)K < 3e7) threads = 1;                                          \
    ls_parallel(strips_##SFX, &a, strips, threads);                                                     \
  }

DRIVER(f16, uint16_t)
DRIVER(f32, float)

/* y = x @ W.T (+ bias) as ls_linear, plus each row's argmax over its N outputs (the first
 * maximum; a NaN counts as larger than any number, as torch.argmax and numpy's argmax
 * have it).
 *
 * Why: greedy decoding wants only the argmax of the lm_head's logits, and reading them
 * back after the product is slow: by the time the head has streamed its weight (6 MB for
 * the zoo target) through the L2 cache, its first outputs have left it, and an argmax over
 * 3 x 8192 logits right after the head took 30-35 us against 4 us on the same logits
 * when cached.  Here each strip's outputs are scanned while they are still in the L1
 * cache.  Each strip keeps its own best (value, column) per row, so the result does not
 * depend on the number of threads: the strips are merged in column order. */
static inline int ls_better(float v, float best) { return v > best || (v != v && best == best); }

typedef int32_t vfi __attribute__((vector_size(LS_VW * 4)));

/* The first maximum of row[c0..c1) (c1 > c0) and its column: the largest value by a vector
 * max over LS_VW-column blocks, then the first column holding it; a block with a NaN (which
 * the vector max would not order as numpy does) falls back to the scalar scan. */
static int64_t ls_span_argmax(const float *row, int64_t c0, int64_t c1, float *best_out) {
  int64_t j = c0, nfull = (c1 - c0) / LS_VW;
  float best = row[c0];
  if (nfull > 0) {
    vf mx = loadv(row + c0);
    vfi nan = (vfi)(mx != mx);
    for (int64_t b = 1; b < nfull; b++) {
      vf v = loadv(row + c0 + LS_VW * b);
      vfi gt = (vfi)(v > mx);
      mx = (vf)((gt & (vfi)v) | (~gt & (vfi)mx));
      nan |= (vfi)(v != v);
    }
    int any_nan = 0;
    for (int l = 0; l < LS_VW; l++) any_nan |= nan[l];
    if (!any_nan) {
      for (int l = 0; l < LS_VW; l++)
        if (mx[l] > best) best = mx[l];
      j = c0 + LS_VW * nfull;  /* the tail, scalar */
      for (int64_t t = j; t < c1; t++)
        if (ls_better(row[t], best)) best = row[t];
      if (best != best) goto scalar;  /* a NaN in the tail */
      for (j = c0; row[j] != best; j++) {
      }
      *best_out = best;
      return j;
    }
  }
scalar:
  best = row[c0];
  j = c0;
  for (int64_t t = c0 + 1; t < c1; t++)
    if (ls_better(row[t], best)) best = row[t], j = t;
  *best_out = best;
  return j;
}

#define ARGMAX_DRIVER(SFX, WT)                                                                              \
  typedef struct {                                                                                          \
    args_##SFX a;                                                                                           \
    float *best;                                                                                            \
    int64_t *at;                                                                                            \
  } argmax_args_##SFX;                                                                                      \
  static void argmax_strips_##SFX(void *ctx, int64_t s0, int64_t s1) {                                      \
    argmax_args_##SFX *c = (argmax_args_##SFX *)ctx;                                                        \
    const args_##SFX *a = &c->a;                                                                            \
    for (int64_t s = s0; s < s1; s++) {                                                                     \
      strips_##SFX((void *)a, s, s + 1);                                                                    \
      int64_t c0 = s * STRIP * 16, c1 = (s + 1) * STRIP * 16 < a->N ? (s + 1) * STRIP * 16 : a->N;          \
      for (int64_t m = 0; m < a->M; m++) {                                                                  \
        c->at[s * a->M + m] = ls_span_argmax(a->y + m * a->ldy, c0, c1, &c->best[s * a->M + m]);            \
      }                                                                                                     \
    }                                                                                                       \
  }                                                                                                         \
  int ls_linear_argmax_##SFX(const float *x, int64_t M, int64_t K, int64_t ldx, const WT *w, int64_t N,     \
                             const float *bias, float *y, int64_t ldy, int64_t *out, int threads) {         \
    int64_t strips = ((N + 15) / 16 + STRIP - 1) / STRIP;                                                   \
    if (M <= 0 || N <= 0) return 0;                                                                         \
    argmax_args_##SFX c = {{x, M, K, ldx, w, N, bias, y, ldy}, malloc(sizeof(float) * strips * M),          \
                           malloc(sizeof(int64_t) * strips * M)};                                           \
    if (!c.best || !c.at) {                                                                                 \
      free(c.best);                                                                                         \
      free(c.at);                                                                                           \
      return -1;                                                                                            \
    }                                                                                                       \
    if ((double)M * (double)N * (double)K < 3e7) threads = 1;                                               \
    ls_parallel(argmax_strips_##SFX, &c, strips, threads);                                                  \
    for (int64_t m = 0; m < M; m++) {                                                                       \
      float best = c.best[m];                                                                               \
      int64_t at = c.at[m];                                                                                 \
      for (int64_t s = 1; s < strips; s++)                                                                  \
        if (ls_better(c.best[s * M + m], best)) best = c.best[s * M + m], at = c.at[s * M + m];             \
      out[m] = at;                                                                                          \
    }                                                                                                       \
    free(c.best);                                                                                           \
    free(c.at);                                                                                             \
    return 0;                                                                                               \
  }

ARGMAX_DRIVER(f16, uint16_t)
ARGMAX_DRIVER(f32, float)

