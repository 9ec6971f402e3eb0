"""``lightspec bench``'s tables: the printed text table per workload, and Markdown (with SVG plots)
for the report."""

from __future__ import annotations

import os
from html import escape

COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]


def write_markdown(report: dict, path: str, title: str = "Benchmark results") -> None:
    out_dir = os.path.dirname(os.path.abspath(path))
    stem = os.path.splitext(os.path.basename(path))[0]
    lines = [f"## {title}", ""]
    m = report["machine"]
    lines += [
        f"- command: `{report.get('command_line', report['command'])}`",
        f"- model: `{report['model']}`" + (f", draft: `{report['draft_model']}`" if report.get("draft_model") else ""),
        f"- device: {report['device']} ({m.get('gpu') or m['platform']}, {m['threads']} threads), dtype {report['dtype']}"
        + (f"; CPU {m['cpu']}, LightSpec CPU kernels {m['cpu_kernels']}" if m.get("cpu") else ""),
        f"- python {m['python']}, torch {m['torch']}, transformers {m['transformers']}",
        f"- max new tokens {report['max_new_tokens']}; every batch run {report.get('repeat', 1)}× "
        + ({"step": "(the methods in lockstep: one decoding step of each in turn, each timed on its own; HF's "
                    "baselines and LightSpec's methods as two lockstep groups, one after the other)",
            "step-mixed": "(all methods in one lockstep: one decoding step of each in turn, each timed on its own)"}
           .get(report.get("interleave"), "(interleaved batch by batch)"))
        + (f", batched runs {report['batch_repeat']}×" if report.get("batch_repeat", report.get("repeat", 1)) != report.get("repeat", 1) else "")
        + "; "
        f"sampled runs {'seeded from ' + str(report['seed']) if report.get('seed') is not None else 'unseeded'}; "
        "greedy outputs are compared with HF vanilla greedy at batch 1 (batched runs: on the prompts the batch-1 runs had)",
    ]
    lines.append("- each method first runs a workload's first batch once untimed, as the timed runs do "
                 "(batch size, new tokens); the order of the methods rotates every second batch and is mirrored in between; "
                 "speed-ups come with the 95% interval of the paired rounds' ratios"
                 + ("; `none (control)` is a second, identical `none` pipeline" if any(
                     r["name"] == "none (control)" for run in report["runs"] for w in run["workloads"].values()
                     for r in w["results"]) else ""))
    if report.get("interleave") in ("step", "step-mixed"):
        lines.append("- overhead: wall time outside model forwards per step, from one more run of every batch with "
                     "the method alone (in lockstep the other methods' steps evict its caches between its steps; "
                     "that figure is `overhead_fraction_lockstep` in the JSON)")
    lines.append("- bubble: the share of the steps' wall time in which neither a drafter nor the target computed "
                 "(step events' `bubble_ratio` weighted by step time"
                 + ("; from the runs alone, `bubble_ratio_lockstep` in the JSON)"
                    if report.get("interleave") in ("step", "step-mixed") else ")"))
    lines += [f"- {note}" for note in report.get("notes", [])]
    if report.get("stats_report"):
        sr = report["stats_report"]
        lines.append(f"- per-step charts of the LightSpec methods (scheduling heat-map, budget, latencies): "
                     f"[{sr['html']}]({sr['html']}), from `{sr['jsonl']}` (`lightspec report {sr['jsonl']}`)")
    forwards = sorted(set((report.get("target_forward") or {}).values()))
    if forwards:
        lines.append("- LightSpec's target forward: " + ", ".join(forwards)
                     + " (lean: the exact lean forward, checked bit for bit against HF's at load)")
    lines += [""]
    for run in report["runs"]:
        lines += [f"### batch {run['batch_size']}, temperature {run['temperature']}", ""]
        lines += _run_tables(run)
    if report["runs"]:
        sp_name = f"{stem}_speedup.svg"
        with open(os.path.join(out_dir, sp_name), "w") as f:
            f.write(speedup_svg(report["runs"][0]))
        pos_name = f"{stem}_acceptance.svg"
        with open(os.path.join(out_dir, pos_name), "w") as f:
            f.write(acceptance_svg(report["runs"][0]))
        first = report["runs"][0]
        lines += [f"![speed-up per workload (batch {first['batch_size']}, temperature {first['temperature']})]({sp_name})", "",
                  f"![acceptance per draft position (batch {first['batch_size']}, temperature {first['temperature']})]({pos_name})", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def overall(run: dict) -> list[dict]:
    """Per method, over all workloads of a run: total tokens / total time, and the ratio to
    the run's baseline method (HF vanilla at batch 1, LightSpec's ``none`` when batched)."""
    tot: dict[str, list[float]] = {}
    base_name = None
    for w in run["workloads"].values():
        base_name = base_name or w["baseline"]
        for r in w["results"]:
            if r["error"]:
                continue
            t = tot.setdefault(r["name"], [0.0, 0.0])
            t[0] += r["tokens"]
            t[1] += r["seconds"]
    base = tot.get(base_name)
    base_tps = base[0] / base[1] if base and base[1] else None
    plain = tot.get("none") if base_name != "none" else None
    plain_tps = plain[0] / plain[1] if plain and plain[1] else None
    return [{"name": n, "tokens_per_s": a / b if b else 0.0,
             "speedup": (a / b) / base_tps if b and base_tps else None, "baseline": base_name,
             "vs_none": (a / b) / plain_tps if b and plain_tps and not n.startswith("hf_") else None}
            for n, (a, b) in tot.items()]


def vs_none_text(r: dict, times: str = "×") -> str:
    """A LightSpec result's speed against ``none`` in the same run (batch 1, where the baseline
    is HF's), with the paired rounds' 95% interval where there is one; "-" for others."""
    return _ratio_text(r.get("speedup_vs_none"), r.get("speedup_vs_none_ci95"), times)


def speedup_text(r: dict, times: str = "×") -> str:
    """A result's speed-up against its workload's baseline, with the 95% confidence interval
    of the paired rounds where there is one (``bench.paired_speedup``): "0.99× (0.97-1.01)"."""
    return _ratio_text(r["speedup_vs_hf"], r.get("speedup_ci95"), times)


def _ratio_text(ratio: float | None, ci: list[float] | None, times: str) -> str:
    if not ratio:
        return "-"
    return f"{ratio:.2f}{times}" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")


def format_table(wname: str, w: dict, n: int) -> str:
    """One workload's results as the plain-text table ``lightspec bench`` prints."""
    vs_none = any(r.get("speedup_vs_none") for r in w["results"])
    m = max([30, *(len(r["name"]) + 2 for r in w["results"])])  # a strategy named with options can be long
    lines = [f"\n== {wname} ({n} prompts; speed-up vs {w['baseline']}) ==",
             f"{'method':<{m}}{'tok/s':>9}{'speed-up (95% CI)':>22}" + (f"{'vs none (95% CI)':>22}" if vs_none else "")
             + f"{'acc.len':>9}{'accept':>8}{'overhead':>10}{'bubble':>8}{'+mem MB':>9}{'identical':>11}  per-position acceptance"]
    for r in w["results"]:
        if r["error"]:
            lines.append(f"{r['name']:<{m}} error: {r['error'][:90]}")
            continue
        sp = speedup_text(r, "x")
        al = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
        ac = f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] is not None else "-"
        ov = f"{r['overhead_fraction']:.1%}" if r["overhead_fraction"] is not None else "-"
        bu = f"{r['bubble_ratio']:.1%}" if r.get("bubble_ratio") is not None else "-"
        ident = "-" if r["identical_to_hf"] is None else f"{r['identical_to_hf']}/{r.get('identical_checked') or n}"
        pp = " ".join(f"{x:.2f}" for x in r["per_position_acceptance"][:8])
        vn = f"{vs_none_text(r, 'x'):>22}" if vs_none else ""
        lines.append(f"{r['name']:<{m}}{r['tokens_per_s']:>9.1f}{sp:>22}{vn}{al:>9}{ac:>8}{ov:>10}{bu:>8}{r['peak_extra_mb']:>9.1f}{ident:>11}  {pp}")
    return "\n".join(lines)


def _run_tables(report: dict) -> list[str]:
    rows = overall(report)
    vs_none = any(o["vs_none"] for o in rows)  # batch 1: LightSpec's methods against `none` as well
    lines = ["| method (all workloads) | tok/s | speed-up vs " + str(next(iter(report["workloads"].values()))["baseline"])
             + (" | vs `none` |" if vs_none else " |"), "|---|---:|---:|" + ("---:|" if vs_none else "")]
    for o in rows:
        sp = f"{o['speedup']:.2f}×" if o["speedup"] else "-"
        vn = (f" {o['vs_none']:.2f}× |" if o["vs_none"] else " - |") if vs_none else ""
        lines.append(f"| {o['name']} | {o['tokens_per_s']:.1f} | {sp} |{vn}")
    lines.append("")
    for wname, w in report["workloads"].items():
        wv = any(r.get("speedup_vs_none") for r in w["results"])
        lines += [f"#### {wname} ({w['prompts']} prompts; speed-up vs {w['baseline']}"
                  + (" and vs `none`" if wv else "") + ", with the 95% interval of the paired rounds)", "",
                  "| method | tok/s | speed-up" + (" | vs `none`" if wv else "")
                  + " | mean accepted length | acceptance | overhead | bubble | +peak mem (MB) | identical | per-position acceptance |",
                  "|---|---:|---:|" + ("---:|" if wv else "") + "---:|---:|---:|---:|---:|---:|---|"]
        for r in w["results"]:
            if r["error"]:
                cells = [r["name"], f"error: {escape(r['error'][:80])}"] + [""] * (9 if wv else 8)
                lines.append("| " + " | ".join(cells) + " |")
                continue
            sp = speedup_text(r, "×") + (f" | {vs_none_text(r)}" if wv else "")
            al = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
            ac = f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] is not None else "-"
            ov = f"{r['overhead_fraction']:.1%}" if r["overhead_fraction"] is not None else "-"
            bu = f"{r['bubble_ratio']:.1%}" if r.get("bubble_ratio") is not None else "-"
            ident = "-" if r["identical_to_hf"] is None else f"{r['identical_to_hf']}/{r.get('identical_checked') or w['prompts']}"
            pp = " ".join(f"{x:.2f}" for x in r["per_position_acceptance"][:8]) or "-"
            lines.append(f"| {r['name']} | {r['tokens_per_s']:.1f} | {sp} | {al} | {ac} | {ov} | {bu} | {r['peak_extra_mb']:.1f} | {ident} | {pp} |")
        lines.append("")
    return lines


def speedup_svg(report: dict) -> str:
    workloads = list(report["workloads"])
    methods = []
    for w in report["workloads"].values():
        for r in w["results"]:
            if r["name"] not in methods and not r["error"]:
                methods.append(r["name"])
    vals = {(wn, r["name"]): r["speedup_vs_hf"] or 0 for wn, w in report["workloads"].items() for r in w["results"] if not r["error"]}
    vmax = max([v for v in vals.values()] + [1.0]) * 1.1
    W, H, left, bottom = 120 + 90 * len(workloads) * max(1, len(methods)) // 3 + 200, 320, 50, 60
    plot_h = H - bottom - 20
    group_w = (W - left - 190) / max(1, len(workloads))
    bar_w = group_w * 0.8 / max(1, len(methods))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="14" font-size="13">speed-up vs baseline per workload</text>']
    y1 = H - bottom - plot_h / vmax
    parts.append(f'<line x1="{left}" x2="{W - 190}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="#999" stroke-dasharray="4"/>')
    parts.append(f'<text x="{left - 30}" y="{y1 + 4:.1f}">1.0×</text>')
    for gi, wn in enumerate(workloads):
        x0 = left + gi * group_w + group_w * 0.1
        for mi, mn in enumerate(methods):
            v = vals.get((wn, mn), 0)
            h = plot_h * v / vmax
            x = x0 + mi * bar_w
            parts.append(f'<rect x="{x:.1f}" y="{H - bottom - h:.1f}" width="{bar_w * 0.9:.1f}" height="{h:.1f}" fill="{COLORS[mi % len(COLORS)]}"><title>{escape(mn)}: {v:.2f}×</title></rect>')
        parts.append(f'<text x="{x0:.1f}" y="{H - bottom + 16}">{escape(wn[:18])}</text>')
    for mi, mn in enumerate(methods):
        y = 30 + 16 * mi
        parts.append(f'<rect x="{W - 180}" y="{y - 9}" width="10" height="10" fill="{COLORS[mi % len(COLORS)]}"/><text x="{W - 165}" y="{y}">{escape(mn)}</text>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="20" y2="{H - bottom}" stroke="#333"/><line x1="{left}" x2="{W - 190}" y1="{H - bottom}" y2="{H - bottom}" stroke="#333"/>')
    parts.append("</svg>")
    return "\n".join(parts)


def acceptance_svg(report: dict) -> str:
    series = {}
    for wn, w in report["workloads"].items():
        for r in w["results"]:
            if r["per_position_acceptance"] and not r["error"]:
                series[f"{r['name']} / {wn}"] = r["per_position_acceptance"][:8]
    W, H, left, bottom = 560, 300, 50, 40
    plot_w, plot_h = W - left - 200, H - bottom - 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="14" font-size="13">acceptance rate per draft position</text>']
    n = max((len(v) for v in series.values()), default=1)
    for i, (name, vals) in enumerate(list(series.items())[:10]):
        pts = " ".join(f"{left + plot_w * (j / max(1, n - 1)):.1f},{H - bottom - plot_h * v:.1f}" for j, v in enumerate(vals))
        c = COLORS[i % len(COLORS)]
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        parts.append(f'<rect x="{W - 190}" y="{21 + 15 * i}" width="10" height="10" fill="{c}"/><text x="{W - 175}" y="{30 + 15 * i}">{escape(name[:28])}</text>')
    for j in range(n):
        parts.append(f'<text x="{left + plot_w * (j / max(1, n - 1)) - 3:.1f}" y="{H - bottom + 14}">{j + 1}</text>')
    for v in (0, 0.5, 1):
        y = H - bottom - plot_h * v
        parts.append(f'<text x="{left - 28}" y="{y + 4:.1f}">{v:.1f}</text><line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
    parts.append("</svg>")
    return "\n".join(parts)
