#!/usr/bin/env python3
"""Could a drafter run on the second core while the target verifies?  (docs/design/speed-ceiling.md,
"A drafter on the second core".)

At batch 1 a decode step of the zoo target runs on one thread (``cpu_parallel.h`` keeps decode
products on one), so on a 2-core machine one core idles.  Drafting there during the target's
forward (PEARL's pre- and post-verify; AMUSD's asynchronous drafting) would hide the draft time.
What decides whether that pays here is measured, batch 1, greedy, the zoo models, the suite's first
``--limit`` prompts per workload, 64 new tokens:

* ``threads``: ``none`` at 1 and at 2 torch threads, alternated (what a second core gives the
  target alone, the fair baseline for a method that uses two cores);
* ``thread``: ``none`` alone and with a thread of this process drafting with the zoo draft model
  (its lean forward, a softmax and an argmax per token, as ``draft_model`` drafts), and that
  drafter's time per token alone and beside the target;
* ``process``: the same drafter's time per token alone and while another process decodes with
  ``none`` (the machine's own contention, without the GIL).

``simulate`` then puts the measured slowdowns into a model of a step: serial speculation
(``a / (t_verify(k+1) * gap + k * c + o)``) against the overlapped schedule, where every target
forward verifies the drafts ready when it starts while the drafter extends its chain on the other
core, and any mismatch restarts the chain from the target's token (a plain forward follows).

    python scripts/second_core.py --json docs/design/second_core.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightspec_zoo
import torch
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import lean_forward
from speed_ceiling import WORKLOADS, prompts

from lightspec_core import MTPPipeline

# the verify forward over q = 1..9 slots on the AMD EPYC (AVX2) of run AQ, ms (speed-ceiling.md)
T_VERIFY_AVX2 = [2.30, 2.92, 3.08, 3.34, 4.04, 4.40, 4.80, 5.10, 5.50]


def none_rate(pipe: MTPPipeline, texts: list[str], max_new: int) -> float:
    """``none``'s tokens per second over ``texts`` (prefill included, as the bench counts)."""
    pipe.generate(texts[0], max_new_tokens=8)
    t0 = time.perf_counter()
    for t in texts:
        pipe.generate(t, max_new_tokens=max_new, ignore_eos=True)
    return len(texts) * max_new / (time.perf_counter() - t0)


class Drafter:
    """The zoo draft model drafting greedily token by token from a suite prompt's last 128
    tokens, restarting every 64 tokens; ``count`` tokens so far."""

    def __init__(self, context: list[int]):
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(str(Path(lightspec_zoo.__file__).parent / "models" / "draft"),
                                                     dtype=torch.float32)
        self.runner = lean_forward(model, exact=False, fuse=True) or model
        self.context = torch.tensor([context[-128:]])
        self.count = 0
        self.stop = threading.Event()

    def loop(self) -> None:
        with torch.inference_mode():  # thread-local: every drafting thread enters it itself
            while not self.stop.is_set():
                kv = KVCache(self.runner, 1, torch.device("cpu"), capacity=256)
                logits = kv.forward(self.context).logits[:, -1]
                for _ in range(64):
                    if self.stop.is_set():
                        return
                    p = torch.softmax(logits.float(), dim=-1)
                    tok = torch.from_numpy(p.numpy().argmax(-1))
                    logits = kv.forward(tok[:, None]).logits[:, -1]
                    self.count += 1

    def ms_per_token(self, seconds: float) -> float:
        """Draft alone in this thread for ``seconds``."""
        self.stop.clear()
        timer = threading.Timer(seconds, self.stop.set)
        self.count, t0 = 0, time.perf_counter()
        timer.start()
        self.loop()
        return 1e3 * (time.perf_counter() - t0) / max(1, self.count)


def simulate(p: float, c: float, k_max: int, t_verify: list[float], overhead: float, gap: float,
             target_slowdown: float, drafter_slowdown: float, tokens: int = 200_000, seed: int = 0) -> dict:
    """Tokens per ms of serial speculation (best static k), of the overlapped schedule (best
    cap ``k_max``) and of ``none``, each draft accepted with probability ``p`` independently.

    Overlapped: a forward over q slots verifies the q - 1 drafts ready when it starts and takes
    ``t_verify[q-1] * target_slowdown + overhead``; meanwhile the drafter extends its chain by
    that time over ``c * drafter_slowdown``.  If every draft was accepted and the chain's next
    token equals the target's own, the rest of the chain stays; otherwise the chain restarts
    from the target's token and the next forward starts with no draft."""
    rng = random.Random(seed)
    serial = max(sum(p ** i for i in range(k + 1)) / (t_verify[k] * gap + k * c + overhead)
                 for k in range(1, len(t_verify) - 1))
    best = 0.0
    for cap in range(1, k_max + 1):
        elapsed, done, ready = 0.0, 0, 0.0
        while done < tokens:
            q = 1 + min(cap, int(ready))
            dt = t_verify[q - 1] * target_slowdown + overhead
            m = 0
            while m < q - 1 and rng.random() < p:
                m += 1
            done, elapsed = done + m + 1, elapsed + dt
            left = ready - (q - 1) + dt / (c * drafter_slowdown)
            ready = left - 1 if m == q - 1 and left >= 1 and rng.random() < p else 0.0
        best = max(best, done / elapsed)
    return {"p": p, "serial_vs_none": serial * (t_verify[0] + overhead),
            "overlapped_vs_none": best * (t_verify[0] + overhead)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--none-loop", type=float, help=argparse.SUPPRESS)  # the child of `process`
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    texts = [t for w in WORKLOADS for t in prompts(w, args.limit)]
    pipe = MTPPipeline.from_pretrained(None, strategy="none")
    if args.none_loop:
        end = time.perf_counter() + args.none_loop
        while time.perf_counter() < end:
            none_rate(pipe, texts, args.max_new_tokens)
        return
    drafter = Drafter(pipe.tokenizer(texts[0])["input_ids"])
    res: dict = {"rounds": []}
    for r in range(args.rounds):
        row = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            row[f"none_{threads}_threads_tok_s"] = none_rate(pipe, texts, args.max_new_tokens)
        torch.set_num_threads(1)
        row["drafter_alone_ms"] = drafter.ms_per_token(3.0)
        row["none_alone_tok_s"] = none_rate(pipe, texts, args.max_new_tokens)
        drafter.stop.clear()
        drafter.count = 0
        worker = threading.Thread(target=drafter.loop)
        t0 = time.perf_counter()
        worker.start()
        row["none_beside_drafter_tok_s"] = none_rate(pipe, texts, args.max_new_tokens)
        drafter.stop.set()
        worker.join()
        row["drafter_beside_none_ms"] = 1e3 * (time.perf_counter() - t0) / max(1, drafter.count)
        child = subprocess.Popen([sys.executable, __file__, "--none-loop", "9", "--limit", str(args.limit)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(4.0)  # the child's start-up
        row["drafter_beside_none_process_ms"] = drafter.ms_per_token(3.0)
        child.wait()
        res["rounds"].append(row)
        print(r, {k: round(v, 3) for k, v in row.items()}, flush=True)
    med = {k: statistics.median(row[k] for row in res["rounds"]) for k in res["rounds"][0]}
    res["median"] = med
    target_slow = med["none_alone_tok_s"] / med["none_beside_drafter_tok_s"]
    drafter_slow = med["drafter_beside_none_ms"] / med["drafter_alone_ms"]
    res["slowdowns"] = {"target_beside_drafter": target_slow, "drafter_beside_target": drafter_slow,
                        "drafter_beside_target_process": med["drafter_beside_none_process_ms"] / med["drafter_alone_ms"],
                        "none_2_threads_gain": med["none_2_threads_tok_s"] / med["none_1_threads_tok_s"]}
    # the model, with the zoo draft model's 0.71 ms per token inside the strategy (run AQ) and its
    # measured verify gap (a 3 ms draft adds ~10% to the verify after it: speed-ceiling.md)
    res["model"] = [simulate(p, 0.71, 8, T_VERIFY_AVX2, 0.14, 1.10, target_slow, drafter_slow)
                    for p in (0.6, 0.65, 0.7, 0.75, 0.8)]
    print(json.dumps({"slowdowns": res["slowdowns"], "model": res["model"]}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
