"""On a GPU (or any device): does every architecture of the lossless suite take token trees in
each dtype (the core's start-up probe, ``TargetRunner.supports_trees``), is a forward that ignores
the tree mask still refused, and does a tree strategy over a one-layer draft of the same family
run without a failed step?  The 16-bit tolerance of the probe was set on the CPU (2026-12-04);
this checks it where bfloat16 is the default.

    python scripts/gpu_tree_probe_checks.py --device cuda --json tree_probe.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    from models import ARCHS, MaskIgnoringTarget, ToyTokenizer, cached_model, make_prompts

    from lightspec_core import MTPPipeline, TargetRunner

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device(a.device)
    rows = []
    for dtype_name in a.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for arch in ARCHS:
            target = copy.deepcopy(cached_model(arch)).to(dev, dtype)
            row = {"arch": arch, "dtype": dtype_name, "trees": TargetRunner(target).supports_trees()}
            if row["trees"]:
                draft = copy.deepcopy(cached_model(arch, layers=1, seed=1)).to(dev, dtype)
                outs = MTPPipeline(target, ToyTokenizer(), strategy="dynamic_tree", draft_model=draft,
                                   budget={"type": "static", "k": 4}).generate(make_prompts(4), max_new_tokens=12,
                                                                               ignore_eos=True)
                row["drafted"] = sum(o.stats.drafted for o in outs)
                row["failures"] = sum(len(o.stats.failures) for o in outs)
            rows.append(row)
            print(row, flush=True)
        maskless = MaskIgnoringTarget(copy.deepcopy(cached_model("gpt2")).to(dev, dtype)).eval()
        rows.append({"arch": "gpt2 ignoring the tree mask", "dtype": dtype_name,
                     "trees": TargetRunner(maskless).supports_trees()})
        print(rows[-1], flush=True)
    bad = [r for r in rows if r["trees"] != ("ignoring" not in r["arch"]) or r.get("failures")]
    print(f"{len(rows) - len(bad)}/{len(rows)} as expected", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": str(dev), "rows": rows, "unexpected": bad}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
