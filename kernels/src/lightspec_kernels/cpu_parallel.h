/* Split a kernel's independent work items over a few POSIX threads, for the calls big
 * enough to pay for starting them (a prefill, a wide batch): a thread costs ~20 us to
 * start, a decode step's products take 10-100 us each, so those stay on one thread.
 * Every item is computed exactly as it would be on one thread: results do not depend on
 * the number of threads. */
#pragma once
#include <pthread.h>
#include <stdint.h>

typedef void (*ls_work_fn)(void *ctx, int64_t begin, int64_t end);

typedef struct {
  ls_work_fn fn;
  void *ctx;
  int64_t begin, end;
} ls_span;

static void *ls_span_run(void *arg) {
  ls_span *s = (ls_span *)arg;
  s->fn(s->ctx, s->begin, s->end);
  return NULL;
}

/* Run fn over items [0, n) in `threads` contiguous spans (the caller's thread takes the
 * first); falls back to one thread if a thread cannot be started. */
static void ls_parallel(ls_work_fn fn, void *ctx, int64_t n, int threads) {
  enum { MAX_THREADS = 64 };
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if (threads > n) threads = (int)n;
  if (threads <= 1) {
    fn(ctx, 0, n);
    return;
  }
  ls_span spans[MAX_THREADS];
  pthread_t ids[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (int t = 0; t < threads; t++) {
    spans[t] = (ls_span){fn, ctx, n * t / threads, n * (t + 1) / threads};
  }
  for (int t = 1; t < threads; t++) started[t] = pthread_create(&ids[t], NULL, ls_span_run, &spans[t]) == 0;
  fn(ctx, spans[0].begin, spans[0].end);
  for (int t = 1; t < threads; t++) {
    if (started[t])
      pthread_join(ids[t], NULL);
    else
      fn(ctx, spans[t].begin, spans[t].end);
  }
}
