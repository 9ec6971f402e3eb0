#!/usr/bin/env python3
"""Check a ``lightspec bench --suite default --json`` report against the issues' targets.

Prints a Markdown table (target, measured, met?) for the core's targets (issues 2 and 4) and the
plugins' (issues 26 and 27, ``plugin_targets``), a table of batch 1 greedy speed against
LightSpec's ``none`` with mean accepted lengths per workload, and the overall ratio of every
method per run (total tokens over total time across the workloads).  Used to write the
"Against the issues' targets" section of docs/benchmarks.md.

    python scripts/bench_targets.py docs/benchmarks.json
"""

from __future__ import annotations

import json
import sys

LIGHTSPEC_SPECULATIVE = ("ngram", "draft_model", "layerskip", "hybrid")


def overall(run: dict) -> dict[str, float]:
    """Method -> tokens/s over all workloads (total tokens / total seconds)."""
    tok: dict[str, float] = {}
    sec: dict[str, float] = {}
    for w in run["workloads"].values():
        for r in w["results"]:
            if r["error"]:
                continue
            tok[r["name"]] = tok.get(r["name"], 0) + r["tokens"]
            sec[r["name"]] = sec.get(r["name"], 0) + r["seconds"]
    return {n: tok[n] / sec[n] for n in tok if sec[n]}


def target_weights_mb(report: dict) -> float:
    """Size of the target's weights in the run's dtype, from its safetensors header."""
    import glob
    import os

    from safetensors import safe_open

    bytes_per = {"float32": 4, "float16": 2, "bfloat16": 2}[report["dtype"]]
    n = 0
    for f in glob.glob(os.path.join(report["model"], "*.safetensors")):
        with safe_open(f, "pt") as st:
            for k in st.keys():
                n += _prod(st.get_slice(k).get_shape())
    return n * bytes_per / 2**20


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def ratio_text(run: dict, a: str, b: str) -> tuple[float | None, str]:
    o = overall(run)
    if a not in o or b not in o:
        return None, "not measured"
    parts = []
    for wname, w in run["workloads"].items():
        r = {x["name"]: x for x in w["results"] if not x["error"]}
        if a in r and b in r and r[b]["tokens_per_s"]:
            parts.append(f"{wname} {r[a]['tokens_per_s'] / r[b]['tokens_per_s']:.2f}×")
    return o[a] / o[b], f"{o[a] / o[b]:.2f}× over all workloads ({', '.join(parts)})"


CONTROL = "none (control)"


def paired_logs(r: dict, base: dict) -> list[float]:
    """``log(t_base / t_r)`` per paired round (``log`` of r's speed-up over base in that
    round), as ``bench.paired_speedup`` takes them; empty unless the rounds pair up."""
    import math

    if not r.get("round_seconds") or r["round_tokens"] != base.get("round_tokens"):
        return []
    return [math.log(b / a) for a, b in zip(r["round_seconds"], base["round_seconds"])]


def pooled_ci(run: dict, name: str, base: str = "none") -> tuple[float, float, float] | None:
    """``name`` against ``base`` over all workloads of a run, from every paired round's log
    ratio (as ``bench.paired_speedup`` does per workload): geometric mean and 95% interval."""
    from lightspec_core.bench import ratio_interval

    logs = []
    for w in run["workloads"].values():
        r = {x["name"]: x for x in w["results"] if not x["error"]}
        if name in r and base in r:
            logs += paired_logs(r[name], r[base])
    return ratio_interval(logs)


def batch_target(runs: dict) -> tuple[str, str, bool]:
    """Issue 4's batch target, "speculation never slower than `none`": a claim about every
    cell (strategy, workload, temperature) at once, so it is tested as one family.  Per
    cell, a one-sided paired t test of "not slower" (``bench.slower_p_value`` on the
    paired rounds); a cell is measurably slower when Holm's procedure over all cells
    rejects it at a family-wise 5% (``bench.holm_rejected``).  Tested cell by cell (a 95%
    interval below 1), equal methods would still show about one cell in forty "slower" by
    chance; the text gives that per-cell count too, and the same test applied to the control (a second
    `none`, identical to the first), which must come out clean where the test is fair."""
    from lightspec_core.bench import holm_rejected, slower_p_value

    p_cells, p_control, labels, cells, per_cell, control = {}, {}, {}, [], [], []
    for (bs, t), run in runs.items():
        if bs == 1:
            continue
        for wname, w in run["workloads"].items():
            by = {r["name"]: r for r in w["results"] if not r["error"]}
            for r in w["results"]:
                if r["name"] == "none" or r["error"] or r["speedup_vs_hf"] is None:
                    continue
                ci = r.get("speedup_ci95")
                label = f"{r['name']} {r['speedup_vs_hf']:.2f}×" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "") + f" ({wname}, t={t})"
                p = slower_p_value(paired_logs(r, by.get("none", {})))
                labels[label] = p
                if r["name"] == CONTROL:
                    control.append((r["speedup_vs_hf"], label))
                    p_control[label] = 0.0 if p is None else p
                    continue
                cells.append((r["speedup_vs_hf"], label))
                p_cells[label] = 0.0 if p is None else p  # a cell without paired rounds cannot be cleared
                if ci is None or ci[1] < 1.0:
                    per_cell.append(label)
    slower = holm_rejected(p_cells)
    cells.sort()

    def with_p(label: str) -> str:
        p = labels[label]
        return label + ("" if p is None else f" p={p:.3f}")

    if slower:
        text = "measurably slower (Holm, family-wise 5%): " + "; ".join(with_p(c) for c in slower)
    else:
        text = f"no cell measurably slower (Holm over the {len(p_cells)} cells, family-wise 5%)"
    text += (f"; cell by cell at 5% each (95% interval below 1; ~{0.025 * len(p_cells):.1f} expected by chance "
             f"between equal methods): {len(per_cell)}" + (" (" + "; ".join(with_p(c) for c in per_cell) + ")" if per_cell else ""))
    text += f"; {len(cells)} cells, lowest: " + "; ".join(c for _, c in cells[:3])
    if control:
        lo, hi = min(control), max(control)
        flagged = holm_rejected(p_control)
        least = min(p_control.values())
        text += (f"; the control `none` measured {lo[0]:.2f}-{hi[0]:.2f}× `none` (smallest p {least:.3f}, "
                 + (f"{len(flagged)} flagged by the same test" if flagged else "none flagged by the same test") + ")")
    pooled = []
    for (bs, t), run in runs.items():
        if bs > 1:
            for name in sorted({r["name"] for w in run["workloads"].values() for r in w["results"]} - {"none"}):
                ci = pooled_ci(run, name)
                if ci:
                    pooled.append(f"{name} {ci[0]:.3f}× ({ci[1]:.3f}-{ci[2]:.3f}) t={t}")
    if pooled:
        text += "; over all workloads (paired rounds pooled): " + ", ".join(pooled)
    return "issues 4, 26 and 27: at batch 8 speculation never slower than LightSpec's `none`", text, not slower


def by_name(workload: dict) -> dict[str, dict]:
    return {r["name"]: r for r in workload["results"] if not r["error"]}


def accepted_overall(run: dict, name: str) -> float | None:
    """Mean accepted length (tokens per target forward) of ``name`` over all workloads: total
    tokens over total verify steps, each workload's steps being its tokens / its mean."""
    tokens = steps = 0.0
    for w in run["workloads"].values():
        r = by_name(w).get(name)
        if r is None or not r.get("mean_accepted_length"):
            return None
        tokens += r["tokens"]
        steps += r["tokens"] / r["mean_accepted_length"]
    return tokens / steps if steps else None


def per_workload(run: dict, a: str, b: str) -> dict[str, float]:
    """``a``'s tokens/s over ``b``'s per workload (point estimates)."""
    out = {}
    for wname, w in run["workloads"].items():
        r = by_name(w)
        if a in r and b in r and r[b]["tokens_per_s"]:
            out[wname] = r[a]["tokens_per_s"] / r[b]["tokens_per_s"]
    return out


def _pooled(run: dict, a: str, b: str) -> str:
    ci = pooled_ci(run, a, b)
    return f"paired {ci[0]:.3f}× (95% {ci[1]:.3f}-{ci[2]:.3f})" if ci else "no paired rounds"


def _words(ratios: dict[str, float]) -> str:
    return ", ".join(f"{w} {v:.2f}×" for w, v in ratios.items())


TREE_CHAINS = {"eagle3_tree": "eagle3", "dynamic_tree": "draft_model", "static_tree": "draft_model"}


def plugin_targets(b1: dict) -> list[tuple[str, str, bool]]:
    """Issues 26 and 27's targets that one batch 1 greedy run can judge, for the methods it has.
    "Faster" and "beats" are judged on the paired rounds pooled over the workloads (the 95%
    interval above 1); "on every workload" on each workload's point estimate."""
    rows = []
    o = overall(b1)
    names = set(o)
    if "none" not in o:
        return rows
    for tree, chain in TREE_CHAINS.items():
        if tree in names and chain in names:
            at, ac = accepted_overall(b1, tree), accepted_overall(b1, chain)
            speed = per_workload(b1, tree, chain)
            gain = at / ac - 1 if at and ac else None
            rows.append((f"issue 26: `{tree}` ≥ +20% mean accepted length over `{chain}` and its tokens/s on every workload",
                         f"{at:.2f} against {ac:.2f} ({gain:+.0%}); tokens/s {_words(speed)}; {_pooled(b1, tree, chain)}",
                         gain is not None and gain >= 0.2 and min(speed.values()) >= 1.0))
    if "dspark" in names and "draft_model" in names:
        a = accepted_overall(b1, "dspark")
        ci = pooled_ci(b1, "dspark", "draft_model")
        rows.append(("issue 26: `dspark` mean accepted length ≥ 2.5 overall and faster than `draft_model`",
                     f"{a:.2f}; against `draft_model` {_pooled(b1, 'dspark', 'draft_model')}",
                     a >= 2.5 and ci is not None and ci[1] > 1.0))
    unions = sorted(n for n in names if "union" in n)
    for u in unions:
        alone = [n for n in ("ngram", "draft_model") if n in names]
        cis = {n: pooled_ci(b1, u, n) for n in alone}
        rows.append((f"issue 26: `{u}` beats each drafter alone",
                     "; ".join(f"against `{n}` {_pooled(b1, u, n)}" for n in alone),
                     bool(alone) and all(c is not None and c[1] > 1.0 for c in cis.values())))
    speculative = [n for n in names if n not in ("none", CONTROL) and not n.startswith("hf_")]
    if speculative:
        best = max(speculative, key=lambda n: o[n])
        edit = per_workload(b1, best, "none").get("edit")
        best_edit = max(speculative, key=lambda n: per_workload(b1, n, "none").get("edit", 0.0))
        edit_best = per_workload(b1, best_edit, "none").get("edit")
        rows.append(("issues 26 and 27: best strategy ≥ 1.5× (26) and ≥ 1.6× (27) `none` overall, ≥ 2.0× on `edit` (26)",
                     f"best overall `{best}` {o[best] / o['none']:.2f}× ({_pooled(b1, best, 'none')}; `edit` "
                     f"{edit:.2f}×); best on `edit` `{best_edit}` {edit_best:.2f}×",
                     o[best] / o["none"] >= 1.6 and (edit_best or 0) >= 2.0))
    if "eagle3" in names:
        chain = accepted_overall(b1, "eagle3")
        tree = accepted_overall(b1, "eagle3_tree") if "eagle3_tree" in names else None
        rows.append(("issue 27: EAGLE-3 mean accepted length ≥ 3.0 with trees and ≥ 2.6 as a chain (under the run's budget)",
                     f"chain {chain:.2f}" + (f", tree {tree:.2f}" if tree else ", tree not measured"),
                     chain >= 2.6 and tree is not None and tree >= 3.0))
        for other in ("draft_model", "hybrid"):
            if other in names:
                speed = per_workload(b1, "eagle3", other)
                rows.append((f"issue 27: `eagle3` tokens/s above `{other}` on every workload",
                             f"{_words(speed)}; {_pooled(b1, 'eagle3', other)}", min(speed.values()) > 1.0))
    return rows


def vs_none_table(run: dict) -> list[str]:
    """Markdown: every LightSpec method's speed against ``none`` / mean accepted length per
    workload, and overall, best overall first."""
    o = overall(run)
    if "none" not in o:
        return []
    names = sorted((n for n in o if n != "none" and not n.startswith("hf_")), key=lambda n: -o[n])
    lines = ["| method | " + " | ".join(run["workloads"]) + " | overall |",
             "|---|" + "---|" * len(run["workloads"]) + "---|"]
    for n in names:
        cells = []
        for w in run["workloads"].values():
            r = by_name(w)
            if n in r and "none" in r:
                mal = r[n].get("mean_accepted_length")
                cells.append(f"{r[n]['tokens_per_s'] / r['none']['tokens_per_s']:.2f}×" + (f" / {mal:.2f}" if mal else ""))
            else:
                cells.append("-")
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {o[n] / o['none']:.2f}× |")
    return lines


def main(path: str) -> None:
    report = json.load(open(path))
    runs = {(r["batch_size"], r["temperature"]): r for r in report["runs"]}
    b1 = runs.get((1, 0.0))
    rows = []
    if b1:
        lookup = next((n for n in overall(b1) if n.startswith("hf_prompt_lookup")), None)
        v, text = ratio_text(b1, "ngram", lookup) if lookup else (None, "not measured")
        rows.append((f"issue 2: `ngram` ≥ 1.3× HF `{lookup}`", text, v is not None and v >= 1.3))
        v, text = ratio_text(b1, "draft_model", "hf_assisted")
        rows.append(("issue 2: `draft_model` ≥ 1.3× HF assisted generation (same draft)", text, v is not None and v >= 1.3))
        ov = []
        for w in b1["workloads"].values():
            ov += [r["overhead_fraction"] for r in w["results"] if r["overhead_fraction"] is not None]
        every = [r["overhead_fraction"] for run in report["runs"] for w in run["workloads"].values()
                 for r in w["results"] if r["overhead_fraction"] is not None]
        lock = [r["overhead_fraction_lockstep"] for w in b1["workloads"].values() for r in w["results"]
                if r.get("overhead_fraction_lockstep") is not None]
        in_lockstep = f" (in the lockstep runs, where other methods evict the caches between steps: ≤ {max(lock):.1%})" if lock else ""
        rows.append(("issue 2: engine overhead ≤ 10% of step time (batch 1 greedy)",
                     f"≤ {max(ov):.1%} at batch 1 greedy, each method alone{in_lockstep}; ≤ {max(every):.1%} in every run",
                     max(ov) <= 0.10))
        extra = []
        for w in b1["workloads"].values():
            r = {x["name"]: x for x in w["results"] if not x["error"]}
            if "none" in r:
                extra += [r[n]["peak_extra_mb"] - r["none"]["peak_extra_mb"] for n in r if r[n]["family"] == "lightspec"]
        weights_mb = target_weights_mb(report)
        rows.append(("issue 2: speculation adds ≤ 10% peak memory over the target alone",
                     f"at most {max(extra):+.1f} MB of peak memory (C heap in use) over `none` on the same prompts; the target's "
                     f"{report['dtype']} weights are {weights_mb:.0f} MB (draft weights are loaded before the measurement)",
                     max(extra) <= 0.10 * weights_mb))
        low = []
        for wname, w in b1["workloads"].items():
            for r in w["results"]:
                if r["family"] == "lightspec" and not r["error"] and r["speedup_vs_hf"] is not None and r["speedup_vs_hf"] < 0.95:
                    low.append(f"{r['name']} {r['speedup_vs_hf']:.2f}× on {wname}")
        rows.append(("issues 2 and 4: no strategy below 0.95× HF vanilla on any workload",
                     "; ".join(low) if low else "none below 0.95×", not low))
        o = overall(b1)
        best = max((n for n in o if n in LIGHTSPEC_SPECULATIVE or n.endswith(".yaml")), key=lambda n: o[n])
        v = o[best] / o["hf_vanilla"]
        rows.append(("issue 4: best LightSpec strategy ≥ 2.0× HF vanilla overall", f"{best} {v:.2f}×", v >= 2.0))
        edit = b1["workloads"].get("edit")
        if edit:
            r = max((x for x in edit["results"] if x["family"] == "lightspec" and not x["error"]),
                    key=lambda x: x["speedup_vs_hf"] or 0)
            rows.append(("issue 4: ≥ 2.5× on copy-heavy prompts (`edit`)", f"{r['name']} {r['speedup_vs_hf']:.2f}×",
                         r["speedup_vs_hf"] >= 2.5))
    if any(bs > 1 for bs, _ in runs):
        rows.append(batch_target(runs))
    if b1:
        rows += plugin_targets(b1)
        ident = all(r["identical_to_hf"] is None or r["identical_to_hf"] == (r.get("identical_checked") or w["prompts"])
                    for run in report["runs"] if run["temperature"] == 0
                    for w in run["workloads"].values() for r in w["results"])
        rows.append(("greedy outputs token-identical to HF vanilla greedy", "all identical" if ident else "NOT all identical", ident))
    print("| target (this CPU, 1 thread, batch 1 greedy unless said) | measured | met? |")
    print("|---|---|---|")
    for target, measured, met in rows:
        print(f"| {target} | {measured} | {'yes' if met else 'no'} |")
    print()
    if b1:
        print("Batch 1 greedy, speed vs `none` / mean accepted length:\n")
        print("\n".join(vs_none_table(b1)) + "\n")
    for (bs, t), run in runs.items():
        o = overall(run)
        base = "hf_vanilla" if "hf_vanilla" in o else "none"
        print(f"- overall batch {bs} t={t}: " + ", ".join(f"{n} {v / o[base]:.2f}×" for n, v in o.items()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks.json")
