"""The draft model's own cost inside dynamic_tree: milliseconds per tree_step call and per
decode step's drafting (tree_start + every tree_step), with the whole step's ms and tokens
per step (per row), greedy, fixed shapes (adaptive off), the zoo target and draft, 64 new
tokens; batch 1: 3 code prompts one after the other; ``--batch B``: the first B code prompts
as one batch.  In one process, ``--repeat`` rounds (after one warm-up generate each).

    python plugins/lightspec-tree/scripts/draft_cost.py [--batch 1] [--repeat 2] [--json]
"""
import argparse
import json
import time

import lightspec_zoo
import torch

from lightspec_core import MTPPipeline

CONFIGS = [  # label, dynamic_tree options, static budget k
    ("chain k4 (top_k 1, depth 4)", dict(top_k=1, depth=4), 4),
    ("tree 16 (top_k 4, depth 4)", dict(top_k=4, depth=4, total_tokens=16), 16),
    ("tree 16 (top_k 4, depth 5)", dict(top_k=4, depth=5, total_tokens=16), 16),
    ("tree 10 (top_k 2, depth 5)", dict(top_k=2, depth=5, total_tokens=10), 10),
]


def _timed(obj, name: str, log: list[float]):
    """Wrap ``obj.name`` (an instance attribute) so each call's wall time lands in ``log``."""
    fn = getattr(obj, name)

    def wrapper(*args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            log.append(time.perf_counter() - t)

    setattr(obj, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds per configuration (default 2)")
    ap.add_argument("--batch", type=int, default=1, help="rows per generate (default 1: 3 prompts in turn)")
    ap.add_argument("--json", action="store_true", help="one JSON line per configuration and round")
    args = ap.parse_args()
    torch.set_num_threads(1)
    prompts = [json.loads(line)["prompt"] for line in open(lightspec_zoo.PROMPTS_DIR / "code.jsonl")]
    batches = [[p] for p in prompts[:3]] if args.batch == 1 else [prompts[: args.batch]]
    tp, dp = lightspec_zoo.model_path(), lightspec_zoo.model_path("draft")
    pipes = {}
    for label, kw, k in CONFIGS:
        pipe = MTPPipeline.from_pretrained(tp, strategy="dynamic_tree", draft_model=dp, budget={"type": "static", "k": k},
                                           adaptive=False, **kw)
        logs = {"tree_start": [], "tree_step": []}
        for name, log in logs.items():
            _timed(pipe.strategy.drafter, name, log)
        pipe.generate(prompts[0], max_new_tokens=8)
        pipes[label] = (pipe, logs)
    for r in range(args.repeat):
        for label, (pipe, logs) in pipes.items():
            for log in logs.values():
                log.clear()
            t, steps, toks = time.perf_counter(), 0, 0
            for batch in batches:
                for out in pipe.generate(batch, max_new_tokens=64, ignore_eos=True):
                    steps += out.stats.steps
                    toks += len(out.token_ids) - 1  # the first token comes from the prefill
            dt = time.perf_counter() - t
            start, step = logs["tree_start"], logs["tree_step"]  # one tree_start per drafting step
            row = {"config": label, "batch": args.batch, "round": r,
                   "tree_step_ms": 1000 * sum(step) / max(1, len(step)),
                   "draft_ms_per_step": 1000 * (sum(start) + sum(step)) / max(1, len(start)),
                   "step_ms": 1000 * dt / max(1, len(start)), "tok_per_step": toks / steps}
            if args.json:
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            else:
                print(f"{label:30s} round {r}: tree_step {row['tree_step_ms']:6.2f} ms  drafting "
                      f"{row['draft_ms_per_step']:6.2f} ms/step  step {row['step_ms']:6.2f} ms  "
                      f"{row['tok_per_step']:.2f} tok/step", flush=True)


if __name__ == "__main__":
    main()
