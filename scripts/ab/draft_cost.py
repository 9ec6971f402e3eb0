#!/usr/bin/env python3
"""Draft time per drafted token and step time of strategies at a static k, from the engine's own
step statistics (``StepStats``: ``draft_forward_s``, ``drafted``, ``step_time_s``): the zoo target,
batch 1, greedy, the suite's first 2 prompts per workload, 64 new tokens, 1 thread.

Usage: python scripts/ab/draft_cost.py K OUT.json STRATEGY...
(``none`` as a strategy gives the plain step.)  To compare two commits, run it alternately with
``PYTHONPATH`` pointing at a worktree of the other commit's packages; docs/design/drafting_overhead_ab.json
holds such a comparison.
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from speed_ceiling import WORKLOADS, prompts  # noqa: E402

from lightspec_core import MTPPipeline  # noqa: E402


def main() -> None:
    k, out, names = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    torch.set_num_threads(1)
    texts = [t for w in WORKLOADS for t in prompts(w, 2)]
    res = {}
    for n in names:
        pipe = MTPPipeline.from_pretrained(None, strategy=n, budget=f"static:k={k}")
        events = []
        pipe.bound.sinks.append(lambda event: events.append(event) if event.kind == "step" else None)
        pipe.generate(texts[0], max_new_tokens=8)  # first-use costs stay out
        events.clear()
        for t in texts:
            pipe.generate(t, max_new_tokens=64)
        drafted = sum(sum(e.drafted) for e in events)
        tokens = sum(sum(e.accepted) + len(e.accepted) for e in events)
        res[n] = {"draft_ms_per_token": 1e3 * sum(e.draft_forward_s for e in events) / max(1, drafted),
                  "step_ms": 1e3 * sum(e.step_time_s for e in events) / len(events),
                  "tokens_per_step": tokens / len(events), "steps": len(events)}
        print(n, {a: round(b, 3) for a, b in res[n].items()}, flush=True)
    Path(out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
