"""The four trainers of issues 26 and 27 on one device, a few steps each, then their heads in
use: the check that the training code that ships the zoo heads on the CPU also runs on CUDA.

    python scripts/gpu_train_checks.py --device cuda --json cuda.json      # on the GPU machine
    python scripts/gpu_train_checks.py --device cpu --json cpu.json        # here, the same runs
    python scripts/gpu_train_checks.py --compare cpu.json cuda.json        # losses side by side

Each trainer (``lightspec eagle3 train``, ``dspark train``, ``mtplayer train --kind mtp`` and
``--kind medusa``) trains a small head for the zoo target on lightspec-core's own sources
(``--data``; the same files on both machines), with a fixed seed, for ``--steps`` optimizer
steps; its first and last logged losses are recorded. Then the head drafts for the zoo target on the same device (float32, greedy, 4
suite prompts): the output must equal plain decoding's and no step may fail. ``--compare``
prints both runs' losses: the same code, seed and data on two devices must give the same
first loss (up to float rounding) and a nearby last one (measured on an H200:
docs/benchmarks.md, "GPU, 2026-12-04").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def trainers(zoo: str, data: str, out: Path, dev: str, steps: int) -> dict[str, list[str]]:
    common = ["--target", zoo, "--data", data, "--device", dev]
    return {
        "eagle3": ["eagle3", "train", *common, "--out", str(out / "eagle3"), "--max-steps", str(steps),
                   "--seq-len", "128", "--batch", "4", "--ttt-steps", "3", "--draft-vocab", "1024",
                   "--max-tokens", "60000", "--seed", "1"],
        "dspark": ["dspark", "train", *common, "--out", str(out / "dspark"), "--steps", str(steps),
                   "--sequences", "32", "--prompt-len", "32", "--gen-len", "32", "--batch-size", "8",
                   "--anchors", "4", "--save-every", str(steps), "--seed", "1", "--json"],
        "mtp": ["mtplayer", "train", "--kind", "mtp", *common, "--out", str(out / "mtp"),
                "--max-steps", str(steps), "--seq-len", "128", "--batch", "4", "--log-every", "1",
                "--save-every", str(steps), "--seed", "1", "--json"],
        "medusa": ["mtplayer", "train", "--kind", "medusa", *common, "--out", str(out / "medusa"),
                   "--max-steps", str(steps), "--seq-len", "128", "--batch", "4", "--heads", "2",
                   "--log-every", "1", "--save-every", str(steps), "--seed", "1", "--json"],
    }


def losses(folder: Path) -> list[float]:
    """The logged losses of a finished run, in order (each trainer writes training_log.json)."""
    log = json.loads((folder / "training_log.json").read_text())
    lists = [v for v in log.values() if isinstance(v, list)] if isinstance(log, dict) else [log]
    for entries in lists:  # the step records: eagle3 "log", dspark "history", mtplayer "train"
        found = [float(e["loss"]) for e in entries if isinstance(e, dict) and "loss" in e]
        if found:
            return found
    raise ValueError(f"{folder / 'training_log.json'} has no step records with a loss")


def use_head(name: str, folder: Path, dev: str) -> dict:
    import torch

    import lightspec_zoo
    from lightspec_core import MTPPipeline
    from lightspec_core.loading import load_model, load_tokenizer

    path = str(lightspec_zoo.model_path())
    target = load_model(path, torch.device(dev), torch.float32)
    tok = load_tokenizer(path)
    sets = lightspec_zoo.prompt_sets()
    prompts = [sets[w][0] for w in ("code", "docstring", "edit", "prose")]
    option = {"eagle3": "head", "dspark": "checkpoint", "mtp": "head", "medusa": "head"}[name]
    strategy = {"eagle3": "eagle3", "dspark": "dspark", "mtp": "mtp", "medusa": "mtp"}[name]
    plain = MTPPipeline(target, tok, strategy="none", cpu_kernels=False).generate(prompts, max_new_tokens=48, ignore_eos=True)
    pipe = MTPPipeline(target, tok, strategy={"type": strategy, option: str(folder)}, budget="static:k=3", cpu_kernels=False)
    out = pipe.generate(prompts, max_new_tokens=48, ignore_eos=True)
    return dict(identical_to_none=sum(a.token_ids == b.token_ids for a, b in zip(out, plain)), total=len(prompts),
                failures=sum(len(o.stats.failures) for o in out),
                first_failure=next((f for o in out for f in o.stats.failures), None),
                mean_accepted=round(sum(o.stats.mean_accepted_length for o in out) / len(out), 3))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="/tmp/ls_train_checks")
    ap.add_argument("--only", default="eagle3,dspark,mtp,medusa")
    # tracked files only: an editable install's *.egg-info (text) sits beside the package and
    # does not travel to another machine, so "lightspec_core/src" held other data there
    ap.add_argument("--data", default=str(HERE / "lightspec_core" / "src" / "lightspec_core"),
                    help="training text for every trainer (default: lightspec-core's own sources)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        for name in a["runs"]:
            ra, rb = a["runs"][name], b["runs"].get(name, {})
            print(f"{name:8s} first loss {ra.get('first_loss')} / {rb.get('first_loss')}   "
                  f"last {ra.get('last_loss')} / {rb.get('last_loss')}   use: {ra.get('use')} / {rb.get('use')}")
        return 0

    import lightspec_zoo

    out = Path(args.out)
    runs, bad = {}, 0
    cmds = trainers(str(lightspec_zoo.model_path()), args.data, out, args.device, args.steps)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in args.only.split(","):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "lightspec_core.cli", *cmds[name]], capture_output=True,
                              text=True, env=env, timeout=600)
        run = dict(rc=proc.returncode, seconds=round(time.perf_counter() - t0, 1), stderr_tail=proc.stderr[-1500:])
        if proc.returncode == 0:
            try:
                ls = losses(out / name)
                run.update(first_loss=ls[0], last_loss=ls[-1], logged=len(ls))
                run["use"] = use_head(name, out / name, args.device)
                bad += run["use"]["identical_to_none"] != run["use"]["total"] or run["use"]["failures"] > 0
            except Exception as exc:  # reported, and the script fails at the end
                run["error"] = f"{type(exc).__name__}: {exc}"
                bad += 1
        else:
            bad += 1
        runs[name] = run
        print(name, json.dumps({k: v for k, v in run.items() if k != "stderr_tail"}),
              "" if proc.returncode == 0 else proc.stderr[-1500:], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "steps": args.steps, "runs": runs}, indent=1))
    print("TRAIN PROBLEMS:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
