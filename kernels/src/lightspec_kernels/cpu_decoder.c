/* A Llama-family decoder block for a few new tokens, as one call (x86-64 CPUs, float32).
 *
 * Why: with the products, the attention and the norms compiled (cpu_linear, cpu_attention,
 * cpu_norm_rope), a small model's decode step is still half Python: the zoo target's step
 * over 400 cached tokens took 3.4 ms at one thread, of which its products were 1.7 ms,
 * the rest some 25 tensor operations and kernel calls per block at a few microseconds
 * each.  Here one call runs everything of a block between two SwiGLU activations:
 *
 *   ls_block_front:  [h += down_prev(act)]  x = norm1(h)  qkv = x Wqkv  rotate q, k
 *                    write k, v into the cache slabs  attention  h += o(attn)
 *                    x = norm2(h)  gate_up = x Wgu
 *   ls_block_tail:   h += down(act)  out = final_norm(h)
 *
 * and the caller computes act = silu(gate) * up in between with PyTorch's own operations
 * (whose exp rounding this file does not reproduce).
 *
 * ls_two_stream_layer is EAGLE-3's draft layer (its attention reads a token's embedding and
 * a feature side by side), SwiGLU (ls_silu_mul) and final norm included, in one call: a
 * draft token of the zoo's head was ~20 PyTorch operations and kernel calls, ~350 us on
 * this CPU for ~50 us of arithmetic (docs/design/eagle3.md, "Drafting cost").  Drafts never
 * change a generation's output, so its SwiGLU need not round as PyTorch's.
 *
 * Numerics: it calls the very kernels the model's modules run (their entry points are
 * passed in as function pointers, each compiled with its own flags), on the same values in
 * the same order, so its results are those of the op-by-op forward bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

typedef int32_t vfi __attribute__((vector_size(LS_VW * 4)));

typedef void (*linear_t)(const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int64_t N,
                         const float *bias, float *y, int64_t ldy, int threads);
typedef void (*norm_t)(const float *x, int64_t ldx, const float *r, int64_t ldr, float *sum, int64_t lds,
                       int64_t rows, int64_t H, const float *w, float eps, float *y, int64_t ldy);
typedef void (*rotary_t)(const float *x, int64_t B, int64_t N, int64_t Q, int64_t D, int64_t xsb, int64_t xsn,
                         int64_t xsq, const float *cos_, const float *sin_, int64_t csb, int64_t csq, float *out);
typedef int (*attention_t)(const float *q, int64_t B, int64_t H, int64_t Q, int64_t D, int64_t qsb, int64_t qsh,
                           int64_t qsq, const float *k, const float *v, int64_t Hkv, int64_t C, int64_t ksb,
                           int64_t ksh, int64_t ksc, int64_t vsb, int64_t vsh, int64_t vsc, const uint8_t *bmask,
                           const float *fmask, int64_t msb, int64_t msh, int64_t msq, int64_t msc, int causal,
                           float scale, float *out, int threads);

/* One projection y = x W^T + b: its kernel entry (ls_linear_f16 or _f32) and packed weight. */
typedef struct {
  linear_t fn;
  const void *w;
  const float *bias; /* [n] or NULL */
  int64_t n, k;
} ls_proj;

typedef struct {
  ls_proj qkv, o, gate_up, down; /* qkv: q, k, v outputs side by side; gate_up likewise */
  const float *norm1, *norm2;    /* RMSNorm weights [hidden] */
  float eps1, eps2;
} ls_block;

typedef struct {
  int64_t hidden, heads, kv_heads, head_dim, inter;
  float scale;
  norm_t norm;
  rotary_t rotary;
  attention_t attention;
} ls_model;

static inline void project(const ls_proj *p, const float *x, int64_t M, float *y, int threads) {
  p->fn(x, M, p->k, p->k, p->w, p->n, p->bias, y, p->n, M > 8 ? threads : 1);
}

/* Everything of a block after the input norm: qkv = x Wqkv (x [M, blk->qkv.k]), rotate q, k,
 * write k, v into the cache slabs, attention, h += o(attn), x2 = norm2(h), gate_up = x2 Wgu.
 * Arguments as ls_block_front's; the rest are its scratch areas (x2 [M, hidden] may be x). */
static int block_body(const ls_model *m, const ls_block *blk, int64_t B, int64_t q, const int64_t *rows, int64_t M,
                      int64_t cols, const int64_t *offsets, int64_t cap, float *k_slab, float *v_slab,
                      const float *cos_, const float *sin_, const uint8_t *mask, float *h, const float *x, float *x2,
                      float *t, float *qkvp, float *qkv, float *qk, float *attn, float *attnp, float *gate_up,
                      int threads) {
  const int64_t BQ = B * q, Hd = m->hidden, H = m->heads, G = m->kv_heads, D = m->head_dim;
  const int64_t W = (H + 2 * G) * D, C = cols + q;
  project(&blk->qkv, x, M, qkvp, threads);
  if (rows) { /* spread the real tokens over their slots, zeros in the padding */
    memset(qkv, 0, (size_t)(BQ * W) * sizeof(float));
    for (int64_t j = 0; j < M; j++) memcpy(qkv + rows[j] * W, qkvp + j * W, (size_t)W * sizeof(float));
  }
  /* q and k heads of [B, q, H + 2G, D], viewed as [B, H + G, q, D] */
  m->rotary(qkv, B, H + G, q, D, q * W, D, W, cos_, sin_, q * D, D, qk);
  for (int64_t b = 0; b < B; b++)
    for (int64_t g = 0; g < G; g++)
      for (int64_t i = 0; i < q; i++) {
        const int64_t c = (offsets ? offsets[b] : cols) + i;
        float *kd = k_slab + ((b * G + g) * cap + c) * D;
        float *vd = v_slab + ((b * G + g) * cap + c) * D;
        memcpy(kd, qk + ((b * (H + G) + H + g) * q + i) * D, (size_t)D * sizeof(float));
        memcpy(vd, qkv + (b * q + i) * W + (H + G + g) * D, (size_t)D * sizeof(float));
      }
  int rc = m->attention(qk, B, H, q, D, (H + G) * q * D, q * D, D, k_slab, v_slab, G, C, G * cap * D, cap * D, D,
                        G * cap * D, cap * D, D, mask, NULL, q * C, 0, C, 1, 1, m->scale, attn, q > 16 ? threads : 1);
  if (rc) return rc;
  if (rows)
    for (int64_t j = 0; j < M; j++) memcpy(attnp + j * H * D, attn + rows[j] * H * D, (size_t)(H * D) * sizeof(float));
  project(&blk->o, attnp, M, t, threads);
  m->norm(h, Hd, t, Hd, h, Hd, M, Hd, blk->norm2, blk->eps2, x2, Hd);
  project(&blk->gate_up, x2, M, gate_up, threads);
  return 0;
}

/* Floats of scratch ls_block_front needs for B * q = BQ token slots. */
int64_t ls_front_work(const ls_model *m, int64_t BQ) {
  const int64_t H = m->heads, G = m->kv_heads, D = m->head_dim;
  return BQ * (2 * m->hidden + 2 * (H + 2 * G) * D + (H + G) * D + 2 * H * D);
}

/* One block for B rows of q new token slots each (row-major [B][q]), of which M are real
 * tokens: rows == NULL means all B q (M = B q); otherwise rows[j] (increasing) is the slot
 * b q + i of real token j, and only the real tokens go through the products (a batch's
 * verify pads short drafts: the padding costs no product).  Padding slots get zero keys
 * and values, and their mask rows must be all zero (they attend to nothing).
 *
 * h [M, hidden]: the residual stream of the real tokens, updated in place.  act [M, inter]
 * with down_prev: the previous block's activation, whose down projection is added to h
 * first (NULL at block 0).  record [M, hidden] or NULL: receives h as this block's input.
 * Cache: k_slab, v_slab [B, kv_heads, cap, head_dim]; columns [0, cols) hold the cache,
 * the q new keys/values are written to columns [cols, cols + q) and attended to with it.
 * offsets [B] or NULL: row b's new keys/values go to columns [offsets[b], offsets[b] + q)
 * instead (rows of different lengths, each packed from column 0; offsets[b] <= cols, and
 * the mask must then hide each row's columns past its own).
 * cos, sin [B, q, head_dim]: the rotary tables at the new slots' positions.
 * mask [B, q, cols + q] (nonzero = visible) or NULL: causal over all columns.
 * gate_up [M, 2 inter]: the output.  work: ls_front_work(B q) floats.  Returns 0, or the
 * attention's error. */
int ls_block_front(const ls_model *m, const ls_block *blk, const ls_proj *down_prev, int64_t B, int64_t q,
                   const int64_t *rows, int64_t M, int64_t cols, const int64_t *offsets, int64_t cap, float *k_slab,
                   float *v_slab, const float *cos_, const float *sin_, const uint8_t *mask, float *h,
                   const float *act, float *record, float *work, float *gate_up, int threads) {
  const int64_t BQ = B * q, Hd = m->hidden, H = m->heads, G = m->kv_heads, D = m->head_dim;
  const int64_t W = (H + 2 * G) * D;
  float *x = work;                    /* [M, hidden] normed input of a projection */
  float *t = x + BQ * Hd;             /* [M, hidden] a projection's output */
  float *qkvp = t + BQ * Hd;          /* [M, W] the real tokens' q, k, v */
  float *qkv = qkvp + BQ * W;         /* [B, q, H + 2G, D] every slot's */
  float *qk = qkv + BQ * W;           /* [B, H + G, q, D] rotated queries and keys */
  float *attn = qk + BQ * (H + G) * D; /* [B, q, H, D] */
  float *attnp = attn + BQ * H * D;   /* [M, H D] the real tokens' */
  if (!rows) {
    M = BQ;
    qkvp = qkv;
    attnp = attn;
  }

  if (act) {
    project(down_prev, act, M, t, threads);
    m->norm(h, Hd, t, Hd, h, Hd, M, Hd, blk->norm1, blk->eps1, x, Hd);
  } else {
    m->norm(h, Hd, NULL, 0, NULL, 0, M, Hd, blk->norm1, blk->eps1, x, Hd);
  }
  if (record) memcpy(record, h, (size_t)(M * Hd) * sizeof(float));
  return block_body(m, blk, B, q, rows, M, cols, offsets, cap, k_slab, v_slab, cos_, sin_, mask, h, x, x, t, qkvp, qkv,
                    qk, attn, attnp, gate_up, threads);
}

/* 2^e for integer lanes e in [-126, 127]. */
static inline vf pow2i(vfi e) { return (vf)((e + 127) << 23); }

/* exp(d), lane by lane, computed as PyTorch's vectorised float exp computes it (SLEEF's
 * expf_u10: d = n ln2 + s with ln2 split in two parts, a degree-6 polynomial in s by
 * multiply-adds, then 2^n applied in two halves), so that silu below rounds as
 * torch.nn.functional.silu.  Whether it does on this machine is checked at run time
 * (cpu_decoder.Decoder probes it against PyTorch), never assumed. */
static inline vf exp_torch(vf d) {
  vf t = d * splatv(1.442695040888963407359924681001892137426645954152985934135449406931f);
  vf nf = t; /* every lane is set below */
  for (int j = 0; j < LS_VW; j++) nf[j] = __builtin_rintf(t[j]);
  vfi n = __builtin_convertvector(nf, vfi);
  vf s = nf * splatv(-0.693145751953125f) + d;
  s = nf * splatv(-1.428606765330187045e-06f) + s;
  vf u = splatv(0.000198527617612853646278381f);
  u = u * s + splatv(0.00139304355252534151077271f);
  u = u * s + splatv(0.00833336077630519866943359f);
  u = u * s + splatv(0.0416664853692054748535156f);
  u = u * s + splatv(0.166666671633720397949219f);
  u = u * s + splatv(0.5f);
  vf ss = s * s;
  u = splatv(1.0f) + (ss * u + s);
  vfi half = n >> 1;
  u = u * pow2i(half) * pow2i(n - half);
  vfi under = d < splatv(-104.0f), over = d > splatv(100.0f);
  u = (vf)((vfi)u & ~under);
  return (vf)(((vfi)u & ~over) | ((vfi)splatv(INFINITY) & over));
}

/* SwiGLU: act[M, I] = silu(gate) * up with gate_up [M, 2I] (gate first), silu(x) =
 * x / (1 + exp(-x)) as PyTorch's float kernel writes it.  I % 16 == 0. */
void ls_silu_mul(const float *gate_up, int64_t M, int64_t I, float *act) {
  for (int64_t r = 0; r < M; r++) {
    const float *g = gate_up + r * 2 * I, *up = g + I;
    float *o = act + r * I;
    for (int64_t j = 0; j + LS_VW <= I; j += LS_VW) {
      vf x = loadv(g + j);
      vf y = x / (splatv(1.0f) + exp_torch(-x)) * loadv(up + j);
      memcpy(o + j, &y, sizeof y);
    }
  }
}

void ls_block_tail(const ls_model *m, const ls_proj *down, const float *norm_w, float eps, int64_t M, float *h,
                   const float *act, float *work, float *out, int threads);

/* The whole stack for one step: block 0 .. n-1 (ls_block_front, then ls_silu_mul), then
 * ls_block_tail into out [M, hidden].  k_slabs, v_slabs, records: one pointer per block
 * (records[i] NULL: not recorded; records itself may be NULL).  act: M * inter floats,
 * gate_up: M * 2 inter.  Use only where ls_silu_mul has been checked to round as the
 * caller's activation does.  Returns 0 or the attention's error. */
int ls_decoder_run(const ls_model *m, const ls_block *blocks, int64_t n, const float *final_norm, float final_eps,
                   int64_t B, int64_t q, const int64_t *rows, int64_t M, int64_t cols, const int64_t *offsets,
                   int64_t cap, float *const *k_slabs, float *const *v_slabs, const float *cos_, const float *sin_,
                   const uint8_t *mask, float *h, float *const *records, float *work, float *gate_up, float *act,
                   float *out, int threads) {
  if (!rows) M = B * q;
  for (int64_t i = 0; i < n; i++) {
    int rc = ls_block_front(m, &blocks[i], i ? &blocks[i - 1].down : NULL, B, q, rows, M, cols, offsets, cap, k_slabs[i],
                            v_slabs[i], cos_, sin_, mask, h, i ? act : NULL, records ? records[i] : NULL, work,
                            gate_up, threads);
    if (rc) return rc;
    ls_silu_mul(gate_up, M, m->inter, act);
  }
  ls_block_tail(m, &blocks[n - 1].down, final_norm, final_eps, M, h, act, work, out, threads);
  return 0;
}

/* The last block's down projection, its residual add and the final norm:
 * h += down(act); out = norm(h).  h, out [M, hidden]; work: M * hidden floats. */
void ls_block_tail(const ls_model *m, const ls_proj *down, const float *norm_w, float eps, int64_t M, float *h,
                   const float *act, float *work, float *out, int threads) {
  const int64_t Hd = m->hidden;
  project(down, act, M, work, threads);
  m->norm(h, Hd, work, Hd, h, Hd, M, Hd, norm_w, eps, out, Hd);
}

/* EAGLE-3's decoder layer (a "two-stream" block): the attention reads the 2 hidden-wide
 * concatenation [norm_a(embed(ids)); norm1(g)] of a token's embedding and a feature g, the
 * residual stream starts from g (or norm1(g) with norm_before_residual), and the rest is a
 * Llama block (ls_block_front's body, SwiGLU, down) with the final norm after it:
 *
 *   a = [norm_a(embed[ids]); norm1(g)]   h = g or norm1(g)   qkv = a Wqkv   rotate q, k
 *   write k, v into the slabs   attention   h += o(attn)   gate_up = norm2(h) Wgu
 *   h += down(silu(gate) * up)   out = final_norm(h)
 *
 * ids [B, q] (int64, each < vocab), positions [B, q] (int64, each < n_pos): rows of the
 * embedding table embed [vocab, hidden] and of the rotary tables cos_table, sin_table
 * [n_pos, head_dim].  g [B q, hidden].  Cache, cols, cap and mask as ls_block_front's (no
 * ragged rows, no offsets).  h, out [B q, hidden]: the layer's output and its final norm.
 * work: ls_two_stream_work(B q) floats.  The block's qkv projection reads 2 hidden; its norm1
 * is the feature's norm (EAGLE-3's hidden_norm), norm2 the post-attention norm.  inter % 16 == 0 (ls_silu_mul).  Returns 0, 1 (the attention could not allocate),
 * 2 (an id >= vocab) or 3 (a position >= n_pos); nothing is written to the cache before
 * the ids and positions are checked. */
typedef struct {
  const float *norm_a, *final_norm;
  float eps_a, final_eps;
  int norm_before_residual;
  const float *embed, *cos_table, *sin_table;
  int64_t vocab, n_pos;
} ls_two_stream;

int64_t ls_two_stream_work(const ls_model *m, int64_t BQ) {
  const int64_t Hd = m->hidden, H = m->heads, G = m->kv_heads, D = m->head_dim;
  return BQ * (4 * Hd + (H + 2 * G) * D + (H + G) * D + H * D + 2 * D + 3 * m->inter);
}

int ls_two_stream_layer(const ls_model *m, const ls_block *blk, const ls_two_stream *ts, int64_t B, int64_t q,
                        const int64_t *ids, const int64_t *positions, const float *g, int64_t cols, int64_t cap,
                        float *k_slab, float *v_slab, const uint8_t *mask, float *h, float *out, float *work,
                        int threads) {
  const int64_t BQ = B * q, Hd = m->hidden, H = m->heads, G = m->kv_heads, D = m->head_dim, I = m->inter;
  const int64_t W = (H + 2 * G) * D;
  for (int64_t j = 0; j < BQ; j++) {
    if (ids[j] < 0 || ids[j] >= ts->vocab) return 2;
    if (positions[j] < 0 || positions[j] >= ts->n_pos) return 3;
  }
  float *a = work;               /* [BQ, 2 hidden] the attention's input */
  float *emb = a + BQ * 2 * Hd;  /* [BQ, hidden] the embeddings */
  float *t = emb + BQ * Hd;      /* [BQ, hidden] a projection's output */
  float *qkv = t + BQ * Hd;      /* [B, q, H + 2G, D] */
  float *qk = qkv + BQ * W;      /* [B, H + G, q, D] */
  float *attn = qk + BQ * (H + G) * D; /* [B, q, H, D] */
  float *cs = attn + BQ * H * D; /* [BQ, D] cos, then [BQ, D] sin */
  float *sn = cs + BQ * D;
  float *gate_up = sn + BQ * D;  /* [BQ, 2 inter] */
  float *act = gate_up + BQ * 2 * I; /* [BQ, inter] */
  for (int64_t j = 0; j < BQ; j++) {
    memcpy(emb + j * Hd, ts->embed + ids[j] * Hd, (size_t)Hd * sizeof(float));
    memcpy(cs + j * D, ts->cos_table + positions[j] * D, (size_t)D * sizeof(float));
    memcpy(sn + j * D, ts->sin_table + positions[j] * D, (size_t)D * sizeof(float));
  }
  m->norm(emb, Hd, NULL, 0, NULL, 0, BQ, Hd, ts->norm_a, ts->eps_a, a, 2 * Hd);
  m->norm(g, Hd, NULL, 0, NULL, 0, BQ, Hd, blk->norm1, blk->eps1, a + Hd, 2 * Hd);
  for (int64_t j = 0; j < BQ; j++)
    memcpy(h + j * Hd, ts->norm_before_residual ? a + j * 2 * Hd + Hd : g + j * Hd, (size_t)Hd * sizeof(float));
  /* the post-attention norm's output reuses emb (read only by the first norm) */
  int rc = block_body(m, blk, B, q, NULL, BQ, cols, NULL, cap, k_slab, v_slab, cs, sn, mask, h, a, emb, t, qkv, qkv,
                      qk, attn, attn, gate_up, threads);
  if (rc) return 1;
  ls_silu_mul(gate_up, BQ, I, act);
  ls_block_tail(m, &blk->down, ts->final_norm, ts->final_eps, BQ, h, act, t, out, threads);
  return 0;
}
