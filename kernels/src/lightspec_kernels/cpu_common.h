/* What every CPU kernel file shares: the machine's float vector type (GCC vector
 * extension) and the instruction-set report that lightspec_kernels._cpu_build checks
 * after loading a library. */
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The machine's own float vector, `LS_VW` lanes: a zmm register with AVX-512, a ymm
 * register with AVX2.  Loops that keep vectors in registers across iterations (the
 * accumulators of a product) use it: without AVX-512 GCC keeps a 64-byte vector on the stack
 * and moves it through memory on every operation (on a Zen 3 VM the product tiles ran at
 * 3.7 G multiply-adds/s that way, against 25 in ymm registers and 28 for the BLAS). */
#if defined(__AVX512F__)
#define LS_VW 16
#else
#define LS_VW 8
#endif
typedef float vf __attribute__((vector_size(LS_VW * 4)));

/* Every lane = f.  Not `(vf){0} + f`: GCC may not drop that + 0 (it would turn -0 into +0),
 * so every broadcast cost an add, and its zero kept one of the 16 ymm registers. */
static inline vf splatv(float f) {
#if defined(__AVX512F__)
  return (vf)_mm512_set1_ps(f);
#elif defined(__AVX__)
  return (vf)_mm256_set1_ps(f);
#else
  return (vf){0} + f;
#endif
}

static inline vf loadv(const float *p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* 2: AVX-512F, 1: AVX2 + F16C + FMA, 0: neither (what the including file was compiled for). */
int ls_isa(void) {
#if defined(__AVX512F__)
  return 2;
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
  return 1;
#else
  return 0;
#endif
}
