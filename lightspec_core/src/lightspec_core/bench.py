"""``lightspec bench``: LightSpec strategies against HF transformers, same prompts, one run.

Baselines (batch 1, as HF's assisted generation supports only batch 1): ``generate``
vanilla; ``prompt_lookup_num_tokens``; ``assistant_model`` (when a draft model is given);
``assistant_early_exit`` (when layerskip is measured).  They run on stock copies of the
target and draft, loaded by transformers alone (``HFModels``): the models LightSpec's
methods run on carry its CPU kernels on the CPU in float32, which make HF's ``generate``
faster too, so HF ``generate`` on LightSpec's target is a row of its own,
``hf_vanilla_lightspec_kernels``.  Every method runs each prompt
once after a warm-up, interleaved with the other methods prompt by prompt (see
``run_workload``); tokens/s is total new tokens over total wall time.  Greedy outputs
are compared token by token with HF vanilla.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass

import click
import torch

from .bench_lockstep import Lane, round_order, run_lockstep  # noqa: F401 - part of bench's API
from .bench_memory import MEMORY_RUNS, PeakMemory  # noqa: F401
from .bench_methods import HFMethod, LightSpecMethod, MethodResult, bubble_seconds  # noqa: F401
from .bench_stats import holm_rejected, paired_speedup, ratio_interval, slower_p_value  # noqa: F401
from .errors import LightSpecError
from .report import format_table  # noqa: F401 - part of bench's API


@dataclass
class HFModels:
    """The models HF's baselines run on: stock copies of the target and the draft, loaded
    by transformers alone, without LightSpec's CPU kernels (``load_model(...,
    cpu_layout=False)``).  ``kernels_row``: also time HF ``generate`` on LightSpec's own
    target (``hf_vanilla_lightspec_kernels``), when that target differs from stock."""

    target: object
    draft: object = None
    kernels_row: bool = False


KERNELS_ROW = "hf_vanilla_lightspec_kernels"  # HF generate on the target as LightSpec loaded it


def default_strategies(draft_model) -> list[str]:
    names = ["none", "ngram", "layerskip", "hybrid"]
    if draft_model:
        names.insert(2, "draft_model")
    from .plugins import get_registry

    builtin = set(names) | {"none", "ngram", "draft_model", "layerskip", "hybrid"}
    names += [n for n in get_registry().names("strategy") if n not in builtin]
    return names


def load_prompt_sets(prompts_file, suite, limit) -> dict[str, list[str]]:
    from .cli import read_prompts

    if suite:
        if suite != "default":
            raise LightSpecError(f"--suite {suite!r} is unknown; allowed: default")
        try:
            import lightspec_zoo
        except ImportError:
            raise LightSpecError("--suite default needs the lightspec-zoo package (its prompts ship there)") from None
        sets = lightspec_zoo.prompt_sets()
        return {k: v[:limit] if limit else v for k, v in sets.items()}
    if not prompts_file:
        raise LightSpecError("give --prompts FILE or --suite default")
    ps = read_prompts((), prompts_file)
    return {os.path.basename(prompts_file): ps[:limit] if limit else ps}


def _budget_specs(budgets) -> list[tuple[str, dict]]:
    """``--budget`` values as (label, spec mapping), each checked by building it once
    (before any model loads)."""
    from .component_spec import build_component, parse_spec, spec_label
    from .plugins import get_registry

    out = []
    for text in budgets:
        spec = parse_spec(text, "budget") if isinstance(text, str) else dict(text)
        build_component("budget", spec, get_registry(), default_type="dynamic", where="--budget")
        out.append((spec_label(text), spec))
    return out


def _methods(names, budgets: list[tuple[str, dict]]) -> list[tuple[str, str, dict | None]]:
    """(strategy, method label, budget spec) per method: each strategy under each budget,
    or under its own when none is given; ``none`` once (it never consults its budget)."""
    if not budgets:
        return [(name, name, None) for name in names]
    out = []
    for name in names:
        for label, spec in [(None, None)] if name == "none" else budgets:
            out.append((name, name if label is None else f"{name}[{label}]", None if spec is None else dict(spec)))
    return out


CONTROL = "none (control)"  # the label of the second `none` pipeline in batched runs
SUITE_CONFIGS = [(1, 0.0), (8, 0.0), (1, 0.8), (8, 0.8)]  # (batch size, temperature)


def main(model=None, strategies=(), draft_model=None, prompts_file=None, suite=None, limit=None, max_new_tokens=64,
         batch_size=1, temperature=0.0, hf_lookup_tokens=10, with_hf=True, device=None, dtype=None, json_out=None,
         md_out=None, lean_target=True, repeat=1, seed=None, batch_repeat=None, interleave="step", control=True,
         budgets=()):
    """``budgets``: budget specs (``component_spec``); each strategy but ``none`` (which
    never drafts) then runs once per budget, labelled ``strategy[budget]``."""
    import sys

    from .loading import cpu_kernels_apply, load_tokenizer
    from .pipeline import MTPPipeline, default_draft_path, default_model_path, load_model, resolve_device, resolve_dtype
    from .plugins import get_registry
    from .strategy_files import check_strategy_spec

    if batch_size < 1:
        raise LightSpecError(f"--batch-size {batch_size} is invalid: use an integer >= 1")
    if repeat < 1:
        raise LightSpecError(f"--repeat {repeat} is invalid: use an integer >= 1")
    if batch_repeat is not None and batch_repeat < 1:
        raise LightSpecError(f"--batch-repeat {batch_repeat} is invalid: use an integer >= 1")
    if max_new_tokens < 1:
        raise LightSpecError(f"--max-new-tokens {max_new_tokens} is invalid: use an integer >= 1")
    if interleave not in ("step", "step-mixed", "batch"):
        raise LightSpecError(f"--interleave {interleave!r} is invalid; allowed: step, step-mixed, batch")
    budgets = _budget_specs(budgets)
    for text in strategies:  # a misspelt --strategy fails before the models load (a YAML file when built)
        check_strategy_spec(text, get_registry())
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if model is None:
        model = default_model_path()
        draft_model = draft_model or default_draft_path()
    if suite and limit is None:
        limit = 6
    configs = SUITE_CONFIGS if suite else [(batch_size, temperature)]
    # a batched suite run gets at least one full batch of prompts per workload
    widest = max(bs for bs, _ in configs)
    sets = load_prompt_sets(prompts_file, suite, max(limit, widest) if suite else limit)
    tok = load_tokenizer(model)
    target = load_model(model, dev, dt, progress=True)
    draft = load_model(draft_model, dev, dt, progress=True) if draft_model else None
    hf_models = None
    if with_hf and any(bs == 1 for bs, _ in configs) and cpu_kernels_apply(dev, dt):
        # LightSpec's target carries its CPU kernels here: HF's baselines get stock copies
        click.echo("loading stock copies for the HF baselines…", err=True)
        hf_models = HFModels(load_model(model, dev, dt, cpu_layout=False),
                             load_model(draft_model, dev, dt, cpu_layout=False) if draft_model else None,
                             kernels_row=True)
    names = list(strategies) or default_strategies(draft_model)
    pipes = {}
    for name, label, budget in _methods(names, budgets):
        try:
            pipes[label] = MTPPipeline(target, tok, strategy=name, draft_model=draft, lean_target=lean_target,
                                       budget=budget)
        except LightSpecError as exc:
            click.echo(f"skipping {label}: {exc}", err=True)
    # batched runs compare with LightSpec's own `none`; a second, identical `none` pipeline
    # measured beside it shows how far two identical methods differ on this machine
    control_pipe = None
    if control and "none" in pipes and any(bs > 1 for bs, _ in configs):
        control_pipe = MTPPipeline(target, tok, strategy="none", lean_target=lean_target)
    report = {"command": "lightspec bench", "command_line": "lightspec " + " ".join(sys.argv[1:]), "model": str(model),
              "draft_model": str(draft_model) if draft_model else None, "device": str(dev),
              "dtype": str(dt).replace("torch.", ""), "max_new_tokens": max_new_tokens, "repeat": repeat,
              "batch_repeat": batch_repeat or repeat, "seed": seed, "interleave": interleave, "machine": machine_info(dev),
              "budgets": [label for label, _ in budgets],
              "target_forward": {name: p.engine.target_forward for name, p in pipes.items()},
              "notes": bench_notes(with_hf, hf_models), "runs": []}
    greedy_ref: dict[str, list[list[int]]] = {}  # HF vanilla greedy outputs at batch 1, per workload
    from .dashboard import bench_link

    stats = bench_link.stats_paths(json_out, md_out)  # the LightSpec methods' step events and their charts
    if stats:
        bench_link.start(stats[0])
    stats_events = 0
    for bs, temp in configs:
        run = {"batch_size": bs, "temperature": temp, "workloads": {}}
        for wname, prompts in sets.items():
            n = max(limit, bs) if suite and limit else len(prompts)
            ids = [tok(p)["input_ids"] for p in prompts[:n]]
            reps = batch_repeat if bs > 1 and batch_repeat else repeat
            run_pipes = {**pipes, CONTROL: control_pipe} if control_pipe is not None and bs > 1 else pipes
            results = run_workload(target, draft, run_pipes, ids, max_new_tokens, bs, temp, hf_lookup_tokens,
                                   with_hf, dev, f"{wname} b{bs} t{temp}", reps, seed, interleave, hf_models)
            vanilla = next((r for r in results if r.name == "hf_vanilla" and not r.error), None)
            if temp == 0 and bs == 1 and vanilla is not None:
                greedy_ref[wname] = vanilla.outputs
            if vanilla is None:  # batched runs compare with LightSpec's own plain decoding
                vanilla = next((r for r in results if r.name == "none" and not r.error), None)
            ref = greedy_ref.get(wname)
            if temp == 0 and ref is not None:
                for r in results:
                    if not r.error and r.name != "hf_vanilla":
                        pairs = list(zip(r.outputs, ref))  # the prompts that have an HF reference
                        r.identical, r.checked = sum(a == b for a, b in pairs), len(pairs)
            if vanilla is not None:
                for r in results:
                    ci = None if r is vanilla or r.error else paired_speedup(r, vanilla)
                    r.speedup_ci95 = ci[1:] if ci else None
            plain = next((r for r in results if r.name == "none" and not r.error), None)
            if plain is not None and plain is not vanilla and plain.tokens_per_s:
                # speculation's own gain: every LightSpec method against `none` as well as against HF
                plain.vs_none = (1.0, None, None)
                for r in results:
                    if r.family == "lightspec" and not r.error and r is not plain:
                        ci = paired_speedup(r, plain)
                        r.vs_none = (r.tokens_per_s / plain.tokens_per_s,) + (tuple(ci[1:]) if ci else (None, None))
            vt = vanilla.tokens_per_s if vanilla else None
            if stats:
                stats_events += bench_link.append_step_events(stats[0], results, f"{wname} b{bs} t{temp}")
            run["workloads"][wname] = {"prompts": len(ids), "baseline": vanilla.name if vanilla else None,
                                       "results": [r.to_dict(vt) for r in results]}
            click.echo(format_table(f"{wname}, batch {bs}, temperature {temp}", run["workloads"][wname], len(ids)))
        report["runs"].append(run)
    if stats and stats_events:
        bench_link.write_page(*stats, title="LightSpec bench: per-step statistics")
        report["stats_report"] = {"jsonl": os.path.basename(stats[0]), "html": os.path.basename(stats[1])}
        click.echo(f"wrote {stats[0]} and its charts {stats[1]}", err=True)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)
        click.echo(f"wrote {json_out}", err=True)
    if md_out:
        from .report import write_markdown

        write_markdown(report, md_out)
        click.echo(f"wrote {md_out}", err=True)
    return report


def bench_notes(with_hf: bool, hf_models: HFModels | None) -> list[str]:
    """What the report's HF rows are, in words (the JSON's ``notes``, the Markdown's list)."""
    if not with_hf:
        return []
    notes = ["HF baselines (hf_vanilla, hf_prompt_lookup, hf_assisted, hf_early_exit) run HF generate on "
             + ("stock copies of the target and draft, loaded by transformers alone (no LightSpec kernels)"
                if hf_models else "the target and draft as transformers loads them (LightSpec's CPU kernels "
                                  "apply only to float32 on the CPU)")]
    if hf_models and hf_models.kernels_row:
        notes.append(f"{KERNELS_ROW}: HF generate on the target as LightSpec loaded it, with its CPU kernels "
                     "(packed linears, kernel RMSNorm, CPU attention), the model the LightSpec rows run on; "
                     "speed-ups are against the stock hf_vanilla")
    return notes


def run_workload(target, draft, pipes, ids, max_new, bs, temp, hf_lookup_tokens, with_hf, dev, label, repeat=1,
                 seed=None, interleave="step", hf_models: HFModels | None = None):
    """Every method on one workload; HF baselines only at batch 1 (assisted generation is batch-1 only).

    HF's baselines run on ``hf_models`` (stock copies: ``HFModels``), or on ``target`` and
    ``draft`` themselves when it is None (where those are what transformers loaded).

    Methods are interleaved so that a change in machine speed during the run (the shared
    VM's forwards vary by 2x from one second to the next) hits all methods alike instead
    of whichever happened to run then:

    * ``interleave="step"`` (the default): every method runs the same batch of prompts at
      the same time, in lockstep: one decoding step of each method in turn (``Lane``),
      each timed on its own.  HF's baselines take their turns among themselves and
      LightSpec's methods among themselves (the two groups one after the other, in turns
      from round to round): HF's steps run stock copies of the models, and with them between
      two LightSpec steps every LightSpec step ran slower, a plain one most of all, which
      inflated speculation's ratios to ``none`` (docs/benchmarks.md, "Lockstep with HF's
      baselines").  ``"step-mixed"``: every method in one lockstep, as runs up to AM did.
      Peak memory then comes from extra, untimed runs of the
      first batch per method, alone, after the timed runs (the lower of two), and the
      engine overhead of LightSpec methods from one more run of every batch, alone
      (``overhead_fraction``; the lockstep runs' figure is kept as
      ``overhead_fraction_lockstep``: interleaving evicts each method's caches).
    * ``"batch"``: each batch of prompts is run by every method in turn before the next
      batch starts, each run timed from start to end.

    Either way the order changes from batch to batch: rotated every second batch and
    mirrored in between, so that over each pair of batches every method's positions add
    up to the same (later lanes of a lockstep round measured slower).  ``repeat`` runs every batch that
    many times (tokens/s over all of them; outputs kept from the first).  ``seed``: seed
    LightSpec's sampled runs (seeded requests use the budget's reproducible, timing-free
    policy); by default they are unseeded, as requests usually are."""
    from tqdm import tqdm

    if interleave not in ("step", "step-mixed", "batch"):
        raise LightSpecError(f"interleave={interleave!r} is invalid; allowed: step, step-mixed, batch")
    methods: list = []
    if with_hf and bs == 1:
        hf_target, hf_draft = (hf_models.target, hf_models.draft) if hf_models else (target, draft)
        methods.append(HFMethod(hf_target, "hf_vanilla", {}, temp, dev))
        if hf_models and hf_models.kernels_row:
            methods.append(HFMethod(target, KERNELS_ROW, {}, temp, dev))
        methods.append(HFMethod(hf_target, f"hf_prompt_lookup({hf_lookup_tokens})", {"prompt_lookup_num_tokens": hf_lookup_tokens}, temp, dev))
        if hf_draft is not None:
            methods.append(HFMethod(hf_target, "hf_assisted", {"assistant_model": hf_draft}, temp, dev))
        if "layerskip" in pipes:
            L = getattr(pipes["layerskip"].strategy, "layers", None)
            L = L if isinstance(L, int) else max(1, hf_target.config.num_hidden_layers // 2)
            methods.append(HFMethod(hf_target, f"hf_early_exit({L})", {"assistant_early_exit": L}, temp, dev))
    methods += [LightSpecMethod(pipe, name, temp) for name, pipe in pipes.items()]
    failed: dict[str, str] = {}
    chunks = [ids[i:i + bs] for i in range(0, len(ids), bs)]
    with tqdm(total=len(methods) * len(ids) * repeat, desc=f"bench {label}", unit="prompt", leave=False) as bar:
        # every method first runs the first batch once, untimed, as the timed rounds run it:
        # a batch shape's one-time costs stay out of them.  The first batch-8 generation of
        # a process measured 610-1110 ms against ~500 for the next ones, and after a warm-up
        # of 8 new tokens the first timed round still 730 ms (its KV cache, sized for all
        # the new tokens, was a fresh allocation); the budget's calibration and one-token
        # probe at a batch size it never saw (~14 ms, once per process) also fall here
        for m in methods:
            try:
                m.warm_up(chunks[0], max_new)
            except Exception as exc:  # a method this model/transformers cannot run is reported, not fatal
                failed[m.result.name] = f"{type(exc).__name__}: {exc}"
        rounds = [(r, c, chunk) for r in range(repeat) for c, chunk in enumerate(chunks)]
        for i, (r, c, chunk) in enumerate(rounds):
            order = round_order(methods, i)
            chunk_seed = None if seed is None else seed + c * bs
            if interleave in ("step", "step-mixed"):
                live = [m for m in order if m.result.name not in failed]
                if interleave == "step-mixed":
                    groups = [live]
                else:  # HF's stock models between two LightSpec steps would slow every LightSpec step
                    hf = [m for m in live if not isinstance(m, LightSpecMethod)]
                    ls = [m for m in live if isinstance(m, LightSpecMethod)]
                    groups = [hf, ls] if i % 2 else [ls, hf]
                for group in groups:
                    if group:
                        run_lockstep(group, chunk, max_new, chunk_seed, r == 0, dev, failed)
                bar.update(len(chunk) * len(order))
                continue
            for m in order:
                if m.result.name not in failed:
                    res = m.result
                    before = (res.tokens, res.seconds)
                    try:
                        m.run(chunk, max_new, seed=chunk_seed, record=r == 0)
                    except Exception as exc:
                        failed[m.result.name] = f"{type(exc).__name__}: {exc}"
                    else:
                        res.round_tokens.append(res.tokens - before[0])
                        res.round_seconds.append(res.seconds - before[1])
                bar.update(len(chunk))
    if interleave != "batch":
        # after the timed runs, as the batch mode measures during them: the allocator has
        # grown its heap by then, so no method is charged for growing it first
        for m in methods:
            if m.result.name not in failed:
                try:
                    m.measure_memory(chunks[0], max_new, seed)
                    if isinstance(m, LightSpecMethod):
                        m.measure_overhead(chunks, max_new, seed)
                except Exception as exc:
                    failed[m.result.name] = f"{type(exc).__name__}: {exc}"
    results = []
    for m in methods:
        m.finish()
        m.result.error = failed.get(m.result.name)
        results.append(m.result)
    return results


def machine_info(dev: torch.device) -> dict:
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads()}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    else:
        info["cpu"] = cpu_model_name()
        info["cpu_kernels"] = cpu_kernels_info()
    return info


def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_kernels_info() -> str:
    """Whether LightSpec's CPU kernels run here: their instruction set, or why not."""
    from lightspec_kernels import cpu_linear

    return f"on ({cpu_linear.isa()})" if cpu_linear.available() else f"off ({cpu_linear.reason()})"
