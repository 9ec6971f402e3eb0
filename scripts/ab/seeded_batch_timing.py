"""Seeded sampling at batch 8 (8 suite prompts, t = 0.8, every request seeded, 64 new tokens,
1 thread): tokens/s (median of 3 rounds after a warm-up) and mean accepted length per strategy.

    python scripts/ab/seeded_batch_timing.py none,draft_model,dspark,hybrid
    PYTHONPATH=<old worktree>/lightspec_core/src:<old worktree>/plugins/lightspec-dspark/src python ...   # the code before

docs/benchmarks.md, "What the seeded-sampling fixes of 2026-12-04 cost".
"""
import sys, time, json, torch, lightspec_zoo
import lightspec_core, lightspec_dspark
from lightspec_core import MTPPipeline
torch.set_num_threads(1)
sets = lightspec_zoo.prompt_sets()
prompts = [p for w in ("code", "docstring", "edit", "prose") for p in sets[w][:2]]
res = {"core_from": lightspec_core.__file__, "dspark_from": lightspec_dspark.__file__}
for strategy in sys.argv[1].split(","):
    pipe = MTPPipeline.from_pretrained(None, strategy=strategy)
    pipe.generate(prompts, max_new_tokens=8, temperature=0.8, seed=list(range(8)), ignore_eos=True)  # warm-up
    times = []
    for r in range(3):
        t0 = time.perf_counter()
        out = pipe.generate(prompts, max_new_tokens=64, temperature=0.8, seed=[100 * r + i for i in range(8)], ignore_eos=True)
        times.append(time.perf_counter() - t0)
    res[strategy] = {"tok_s_median": round(8 * 64 / sorted(times)[1], 1), "mal": round(sum(o.stats.mean_accepted_length for o in out) / 8, 3)}
print(json.dumps(res))
