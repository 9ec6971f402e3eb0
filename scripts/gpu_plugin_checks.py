"""Run on a CUDA machine: the plugin strategies of issues 26 and 27 (and the built-in ones
they compose with) on the zoo target with the shipped heads, against HF ``generate``.

    python scripts/gpu_plugin_checks.py --json out.json            # CUDA, float32 and bfloat16
    python scripts/gpu_plugin_checks.py --device cpu --dtypes float32 --new 16   # a dry run here

Per dtype, strategy and batch size (1 and 8): greedy token ids over 8 suite prompts (2 each
of code, docstring, edit, prose; cut to ``--prompt-tokens``) compared with HF
``generate(do_sample=False)`` at batch 1 on the same device and dtype, the failures the
pipeline reported (a plugin that raises makes its step decode plainly: output stays right,
so a device bug shows only here), the mean accepted length and the wall time. Then, in
float32, seeded sampling (t = 0.8) at batch 1 and 8: every request's text must not depend
on the batch (the user guide's promise; adaptive tree shapes excepted, reported only).

float32 must be token-identical with no failures (exit 1 otherwise); bfloat16 mismatches
are reported, not failed (a k-token verify and a 1-token step can round a near-tie apart).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

STRATEGIES = [
    "none", "ngram", "draft_model", "hybrid",
    "eagle3", "eagle3_tree", "eagle3_tree:adaptive=false", "dspark", "mtp",
    "dynamic_tree", "static_tree", "adaptive",
    "docs/examples/showcase_tree.yaml", "docs/examples/eagle3_cascade.yaml",
    "docs/examples/union.yaml", "docs/examples/union_tree.yaml",
]
SAMPLED = ["ngram", "draft_model", "eagle3", "eagle3_tree:adaptive=false", "dspark", "mtp",
           "docs/examples/union.yaml"]
CPU_KERNELS = False
ADAPTIVE_SHAPES = {"eagle3_tree", "dynamic_tree", "docs/examples/showcase_tree.yaml",
                   "docs/examples/union_tree.yaml"}


def prompts(tok, n_tokens: int) -> list[list[int]]:
    import lightspec_zoo

    sets = lightspec_zoo.prompt_sets()
    out = []
    for w in ("code", "docstring", "edit", "prose"):
        for text in sets[w][:2]:
            out.append(tok(text).input_ids[-n_tokens:])
    return out


def hf_reference(model, batch: list[list[int]], new: int) -> list[list[int]]:
    """HF greedy ``generate`` at batch 1, ``new`` tokens each, the end-of-text token taken
    like any other (as LightSpec's ``ignore_eos=True``; ``min_new_tokens`` would instead mask
    it, and where it is the argmax HF would take the runner-up)."""
    import copy

    saved = model.generation_config
    # the model's own config fills what a passed one leaves unset (None), the end-of-text id too
    model.generation_config = copy.deepcopy(saved)
    model.generation_config.update(eos_token_id=None, pad_token_id=None, bos_token_id=None)
    ref = []
    try:
        with torch.inference_mode():
            for p in batch:
                ids = torch.tensor([p], device=model.device)
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
                ref.append(out[0, len(p):].tolist())
    finally:
        model.generation_config = saved
    return ref


def diagnose(target, tok, batch, ref, new) -> list[dict]:
    """Per prompt where ``none`` (lean and HF target forward) differs from HF ``generate``:
    the first differing position, the two tokens, and the margin between HF's two best
    logits there, from one HF forward over the prompt and the reference continuation."""
    from lightspec_core import MTPPipeline

    out = []
    for lean in (True, False):
        pipe = MTPPipeline(target, tok, strategy="none", lean_target=lean, cpu_kernels=CPU_KERNELS)
        got, _, _ = run(pipe, batch, 1, new)
        for i, (g, r) in enumerate(zip(got, ref)):
            if g == r:
                continue
            j = next(k for k, (a, b) in enumerate(zip(g, r)) if a != b)
            with torch.inference_mode():
                ids = torch.tensor([batch[i] + r[:j]], device=target.device)
                logits = target(ids).logits[0, -1].float()
            top = torch.topk(logits, 2)
            out.append(dict(prompt=i, lean_target=lean, position=j, ours=g[j], hf=r[j],
                            hf_top2=top.indices.tolist(), margin=float(top.values[0] - top.values[1]),
                            ours_minus_hf_logit=float(logits[g[j]] - logits[r[j]]),
                            max_abs_logit=float(logits.abs().max())))
    return out


def run(pipe, batch, bs, new, **kw):
    got, fails, acc, steps = [], [], 0.0, 0
    seeds = kw.pop("seed", None)
    for i in range(0, len(batch), bs):
        if seeds is not None:
            kw["seed"] = seeds[i:i + bs]
        for r in pipe.generate(batch[i:i + bs], max_new_tokens=new, ignore_eos=True, **kw):
            got.append(r.token_ids)
            fails += list(r.stats.failures)
            acc += r.stats.mean_accepted_length
            steps += 1
    return got, fails, acc / max(steps, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated; ';' also separates")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--no-sampled", action="store_true")
    ap.add_argument("--diagnose", action="store_true", help="only: where `none` differs from HF, and by how much")
    ap.add_argument("--cpu-kernels", action="store_true", help="on the CPU: LightSpec's kernels in the models (batch invariant)")
    args = ap.parse_args()

    import lightspec_zoo
    from lightspec_core import MTPPipeline
    from lightspec_core.loading import load_model, load_tokenizer

    dev = torch.device(args.device)
    global CPU_KERNELS
    CPU_KERNELS = args.cpu_kernels
    strategies = [s for s in args.strategies.replace(";", ",").split(",") if s]
    # options with commas ("eagle3_tree:adaptive=false,depth=4") are not split apart here:
    # the defaults above have one option each
    tok = load_tokenizer(str(lightspec_zoo.model_path()))
    batch = prompts(tok, args.prompt_tokens)
    rows, bad = [], []

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        target = load_model(str(lightspec_zoo.model_path()), dev, dtype)
        draft = load_model(str(lightspec_zoo.model_path("draft")), dev, dtype)
        ref = hf_reference(target, batch, args.new)
        if args.diagnose:
            for row in diagnose(target, tok, batch, ref, args.new):
                record(dict(dtype=dname, **row))
            continue
        for spec in strategies:
            for bs in [int(b) for b in args.batches.split(",")]:
                row = dict(dtype=dname, strategy=spec, batch=bs, total=len(batch))
                t0 = time.perf_counter()
                try:
                    pipe = MTPPipeline(target, tok, strategy=spec, draft_model=draft, cpu_kernels=CPU_KERNELS)
                    got, fails, mal = run(pipe, batch, bs, args.new)
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    row.update(identical=sum(a == b for a, b in zip(got, ref)), failures=len(fails),
                               first_failure=fails[0] if fails else None, mean_accepted=round(mal, 3),
                               target_forward=pipe.engine.target_forward)
                except Exception as exc:  # the script reports every case, then fails at the end
                    row.update(identical=0, error=f"{type(exc).__name__}: {exc}",
                               traceback=traceback.format_exc()[-2500:])
                row["seconds"] = round(time.perf_counter() - t0, 2)
                record(row)
                if dname == "float32" and (row["identical"] != row["total"] or row.get("failures") or "error" in row):
                    bad.append(row)
        if dname == "float32" and not args.no_sampled:
            for spec in [s for s in SAMPLED if s in strategies]:
                row = dict(dtype=dname, strategy=spec, sampled=True, total=len(batch))
                try:
                    pipe = MTPPipeline(target, tok, strategy=spec, draft_model=draft, cpu_kernels=CPU_KERNELS)
                    one, f1, _ = run(pipe, batch, 1, args.new, temperature=0.8, seed=list(range(len(batch))))
                    pipe = MTPPipeline(target, tok, strategy=spec, draft_model=draft, cpu_kernels=CPU_KERNELS)
                    eight, f8, mal = run(pipe, batch, 8, args.new, temperature=0.8, seed=list(range(len(batch))))
                    row.update(same_text_batch_1_and_8=sum(a == b for a, b in zip(one, eight)),
                               failures=len(f1) + len(f8), mean_accepted=round(mal, 3))
                except Exception as exc:
                    row.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-2500:])
                record(row)
                if row.get("failures") or "error" in row or (
                        spec not in ADAPTIVE_SHAPES and row["same_text_batch_1_and_8"] != row["total"]):
                    bad.append(row)
        del target, draft
    summary = {}
    for r in rows:
        if "sampled" in r or "identical" not in r:  # sampled rows and --diagnose rows
            continue
        s = summary.setdefault(r["dtype"], [0, 0, 0])
        s[0] += r["identical"]
        s[1] += r["total"]
        s[2] += r.get("failures", 0) + ("error" in r)
    print("SUMMARY identical / total, failures+errors:", {k: f"{a}/{b}, {c}" for k, (a, b, c) in summary.items()})
    print("FLOAT32 PROBLEMS:", len(bad))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary, "problems": bad, "torch": torch.__version__,
                       "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
