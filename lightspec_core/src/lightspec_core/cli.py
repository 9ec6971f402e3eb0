"""The ``lightspec`` command line.  ``--help`` imports neither torch nor transformers:
heavy modules are imported inside the commands.

One file over 400 lines because it is the list of the commands and their options; each command's
work lives elsewhere (``cli_serve``, ``bench``, ``dashboard``, ``prompt_files``)."""

from __future__ import annotations

import json
import logging
import sys

import click

from .errors import InvalidValueError, LightSpecError
from .prompt_files import check_utf8_argument, read_prompts  # noqa: F401 - part of the CLI module


class _Group(click.Group):
    """Loads plugin commands lazily, the first time a command is looked up or listed."""

    _plugins_loaded = False

    def _load_plugin_commands(self, ctx):
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from .plugins import get_registry

        strict = bool(ctx.params.get("strict_plugins"))
        get_registry(strict=True if strict else None).register_commands(self, strict=strict)

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None:
            self._load_plugin_commands(ctx)
            cmd = super().get_command(ctx, name)
        return cmd

    def list_commands(self, ctx):
        try:
            self._load_plugin_commands(ctx)
        except LightSpecError:
            pass
        return super().list_commands(ctx)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("--strict-plugins", is_flag=True, help="Fail when a plugin cannot be loaded (LIGHTSPEC_STRICT_PLUGINS=1).")
@click.pass_context
def cli(ctx, debug, strict_plugins):
    """LightSpec: lossless speculative decoding for Hugging Face causal LMs."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if strict_plugins:
        from .plugins import get_registry

        get_registry(reload=True, strict=True)
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _registry():
    from .plugins import get_registry

    return get_registry()


def _sampling_options(f):
    f = click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy")(f)
    f = click.option("--top-p", type=float, default=1.0, show_default=True)(f)
    f = click.option("--top-k", type=int, default=0, show_default=True, help="0 = off")(f)
    f = click.option("--min-p", type=float, default=0.0, show_default=True)(f)
    f = click.option("--seed", type=int, default=None)(f)
    return f


def _defaults() -> dict:
    from .config import load_defaults

    return load_defaults(".")


@cli.command()
@click.option("--model", "model", default=None,
              help="Target model: a Hugging Face hub id (org/name, through the HF cache; HF_HUB_OFFLINE=1 reads only "
                   "the cache) or a local folder (default: the embedded lightspec-zoo model).")
@click.option("--strategy", default=None,
              help="Strategy: NAME, NAME:OPTION=VALUE,... (e.g. eagle3:max_draft=4; options: lightspec strategies) "
                   "or a YAML file (default: hybrid).")
@click.option("--draft-model", default=None,
              help="Draft model, a hub id or a local folder (strategies draft_model / hybrid).")
@click.option("--prompt", multiple=True, help="Prompt text (repeatable).")
@click.option("--prompts-file", default=None, help="JSONL ('prompt' per line) or text file (one per line).")
@click.option("--max-new-tokens", type=int, default=None, help="Tokens to generate per prompt (default 128).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--eos-token-id", "eos_token_ids", type=int, multiple=True,
              help="Token id that ends a row (repeatable); replaces the model's EOS ids.")
@click.option("--ignore-eos", is_flag=True, help="No token id ends a row: generate --max-new-tokens (or up to a --stop).")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
@click.option("--budget", default=None,
              help="Budget policy: NAME[:OPTION=VALUE,...] or a YAML file, e.g. static:k=2, dynamic:guard=false, "
                   "feedback:alpha=0.6 (default: dynamic; options: lightspec strategies).")
@click.option("--sink", "sinks", multiple=True,
              help="Statistics sink (repeatable): NAME[:OPTION=VALUE,...], e.g. jsonl:path=steps.jsonl or log.")
@click.option("--device", default=None, help="cpu, cuda or auto.")
@click.option("--dtype", default=None, help="float32, bfloat16, float16 or auto.")
@click.option("--stats-out", default=None, help="Write one JSON line per step event to this file.")
@click.option("--stream/--no-stream", default=False, help="Print text as it is generated (one prompt).")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@click.option("--lean-target/--hf-target", default=True, show_default=True,
              help="Run the target through LightSpec's exact lean forward when it reproduces HF's bit for bit (Llama family); --hf-target forces HF's forward.")
@click.option("--batch-size", type=int, default=None,
              help="Decode the prompts in batches of N, in file order, with a progress bar on stderr (default: one batch).")
@_sampling_options
def run(model, strategy, draft_model, prompt, prompts_file, max_new_tokens, stop, eos_token_ids, ignore_eos, threads,
        budget, sinks, device, dtype, stats_out, stream, as_json, lean_target, batch_size, temperature, top_p, top_k,
        min_p, seed):
    """Generate text with a speculative-decoding strategy."""
    d = _defaults()
    prompts = read_prompts(prompt, prompts_file)
    if batch_size is not None and batch_size < 1:
        raise InvalidValueError(f"--batch-size {batch_size} is invalid: use an integer >= 1")
    if max_new_tokens is None:
        max_new_tokens = d.get("max_new_tokens", 128)
    if max_new_tokens < 1:
        raise InvalidValueError(f"--max-new-tokens {max_new_tokens} is invalid: use an integer >= 1")
    for s in stop:
        check_utf8_argument("--stop", s)
        if not s:
            raise InvalidValueError("--stop '' is invalid: an empty stop string would stop every row at once; "
                                    "use a non-empty string")
    if ignore_eos and eos_token_ids:
        raise InvalidValueError(f"--eos-token-id {eos_token_ids[0]} with --ignore-eos: give one of them "
                                "(--ignore-eos means no token id ends a row)")
    bad_eos = next((t for t in eos_token_ids if t < 0), None)
    if bad_eos is not None:
        raise InvalidValueError(f"--eos-token-id {bad_eos} is invalid: use a token id >= 0 (below the vocabulary size)")
    _set_threads(threads)
    from .pipeline import MTPPipeline
    from .sampling import SamplingParams

    # check the sampling flags before spending time on loading the model
    SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    budget, sink_objects = _budget_and_sinks(budget or d.get("budget"), sinks)

    pipe = MTPPipeline.from_pretrained(  # progress: names the model and its source on stderr
        model or d.get("model"),
        strategy=strategy or d.get("strategy", "hybrid"),
        draft_model=draft_model or d.get("draft_model"),
        device=device or d.get("device"),
        dtype=dtype or d.get("dtype"),
        budget=budget,
        sinks=sink_objects,
        stats_out=stats_out,
        progress=not as_json,
        lean_target=lean_target,
    )
    kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                  min_p=min_p, seed=seed, stop=list(stop), ignore_eos=ignore_eos,
                  eos_token_id=list(eos_token_ids) if eos_token_ids else None)
    if stream and len(prompts) == 1 and not as_json:
        for piece in pipe.generate(prompts[0], stream=True, **kwargs):
            click.echo(piece, nl=False)
        click.echo()
        s = pipe.results_stats()[0]
        click.echo(_summary_line(pipe.strategy_name, s), err=True)
        return
    results = _generate_batches(pipe, prompts, batch_size or len(prompts), kwargs)
    if as_json:
        click.echo(json.dumps([
            {"prompt": p, "text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason,
             "stats": r.stats.to_dict()} for p, r in zip(prompts, results)
        ], indent=2))
        return
    for p, r in zip(prompts, results):
        click.echo(p + r.text)
        click.echo(_summary_line(pipe.strategy_name, r.stats), err=True)


def _generate_batches(pipe, prompts: list[str], batch_size: int, kwargs: dict) -> list:
    """``pipe.generate`` over consecutive batches of ``batch_size`` prompts; a progress bar
    (prompts done) on stderr when there is more than one batch."""
    from tqdm import tqdm

    batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
    results = []
    with tqdm(total=len(prompts), unit="prompt", desc="generating", file=sys.stderr,
              disable=len(batches) < 2) as bar:
        for batch in batches:
            results.extend(pipe.generate(batch, **kwargs))
            bar.update(len(batch))
    return results


def _budget_and_sinks(budget, sinks: tuple[str, ...]):
    """``--budget`` and ``--sink`` as components, built before the model loads so that a
    bad name, option or value fails at once."""
    from .component_spec import build_component

    reg = _registry()
    if budget is not None:
        budget = build_component("budget", budget, reg, default_type="dynamic", where="--budget")
    built = [build_component("sink", s, reg, where="--sink") for s in sinks]
    if any(getattr(s, "name", "") == "log" for s in built):  # its lines are INFO records
        logging.getLogger("lightspec.stats").setLevel(logging.INFO)
    ctx = click.get_current_context()
    for sink in built:  # when the command ends: flush what the sinks still hold (a log sink's last line)
        done = getattr(sink, "close", None) or getattr(sink, "flush", None)
        if done is not None:
            ctx.call_on_close(done)
    return budget, built


def _summary_line(strategy: str, s) -> str:
    rate = f"{s.acceptance_rate:.1%}" if s.acceptance_rate is not None else "n/a"
    return (f"[{strategy}] {s.new_tokens} tokens in {s.wall_time_s:.2f}s ({s.tokens_per_s:.1f} tok/s), "
            f"mean accepted length {s.mean_accepted_length:.2f}, acceptance {rate}")


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def plugins(as_json):
    """List loaded plugins, the plugins that failed to load, and whether the CPU kernels run."""
    reg = _registry()
    kernels = _cpu_kernels_status()
    rows = [
        {"name": p.name, "distribution": p.distribution, "version": p.version, "hooks": p.hooks,
         "strategies": [c.split(":", 1)[1] for c in p.components if c.startswith("strategy:")],
         "components": p.components}
        for p in reg.plugins.values()
    ]
    failures = [f.__dict__ for f in reg.failures]
    if as_json:
        click.echo(json.dumps({"plugins": rows, "failures": failures, "cpu_kernels": kernels}, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']:<12} {r['distribution']:<28} {r['version']:<10} hooks: {', '.join(r['hooks'])}")
        click.echo(f"{'':<12} strategies: {', '.join(r['strategies']) or '-'}")
    click.echo(f"cpu kernels: {'on' if kernels['on'] else 'off (' + str(kernels['reason']) + ')'}")
    for f in reg.failures:
        click.echo(f"FAILED {f}", err=True)


def _cpu_kernels_status() -> dict:
    """``{"on": bool, "reason": str | None, "cache_dir": str}`` for LightSpec's CPU kernels
    (built here if they are not cached yet)."""
    try:
        from lightspec_kernels import _cpu_build
    except ImportError as exc:
        return {"on": False, "reason": f"lightspec-kernels cannot be imported: {exc}", "cache_dir": None}
    return _cpu_build.status()


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def strategies(as_json):
    """List strategies (and other components) with their plugin and parameters."""
    reg = _registry()
    rows = [
        {"name": c.name, "kind": c.kind, "plugin": c.plugin, "distribution": c.distribution,
         "description": c.description, "parameters": c.params}
        for c in sorted(reg.components.values(), key=lambda c: (c.kind != "strategy", c.kind, c.name))
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        label = r["name"] if r["kind"] == "strategy" else f"{r['name']} ({r['kind']})"
        click.echo(f"{label:<22} [{r['plugin']}] {r['description']}")
        for k, v in r["parameters"].items():
            click.echo(f"{'':<24}{k}: {v}")
    click.echo("\noptions: --strategy NAME:OPTION=VALUE,... (e.g. eagle3:max_draft=4), --budget the same, "
               "or a YAML file (docs/user-guide.md)")


@cli.command()
@click.option("--model", default=None,
              help="Target model: a hub id (org/name, through the HF cache) or a local folder (default: the embedded model).")
@click.option("--strategy", "strategies_", multiple=True, help="Strategy to measure (repeatable): NAME, NAME:OPTION=VALUE,... or a YAML file "
                   "(default: all built-ins that apply).")
@click.option("--draft-model", default=None, help="Draft model (hub id or local folder) for draft_model and hf_assisted.")
@click.option("--budget", "budgets", multiple=True,
              help="Budget policy (repeatable): NAME[:OPTION=VALUE,...] or a YAML file; each strategy is measured "
                   "under each, labelled e.g. ngram[feedback] (default: the strategy's own, dynamic).")
@click.option("--prompts", "prompts_file", default=None, help="Prompts file (JSONL or text).")
@click.option("--suite", default=None, help="Run a benchmark suite ('default') instead of --prompts.")
@click.option("--limit", type=int, default=None, help="Use only the first N prompts.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--batch-size", type=int, default=1, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--hf-lookup-tokens", type=int, default=10, show_default=True, help="HF prompt_lookup_num_tokens")
@click.option("--no-hf", is_flag=True, help="Skip the HF transformers baselines.")
@click.option("--device", default=None)
@click.option("--dtype", default=None)
@click.option("--seed", type=int, default=None,
              help="Seed LightSpec's sampled runs (seeded requests use the reproducible budget policy); default unseeded.")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Run every batch of prompts this many times, interleaved (steadier ratios on a noisy machine).")
@click.option("--batch-repeat", type=int, default=None,
              help="Repeat batched (batch size > 1) runs this many times instead of --repeat: a workload is one "
                   "batch there, so its ratios are the noisiest and the runs the cheapest to repeat.")
@click.option("--interleave", default="step", show_default=True,
              help="step: run all methods on each batch of prompts at once, one decoding step of each in turn, "
                   "each timed on its own (steadiest ratios), HF's baselines and LightSpec's methods as two groups; "
                   "step-mixed: all methods in one lockstep (runs up to AM; HF's steps slow LightSpec's); "
                   "batch: one method after the other per batch.")
@click.option("--control/--no-control", default=True, show_default=True,
              help="Batched runs: also measure a second `none` pipeline, which shows how far two identical methods differ here.")
@click.option("--threads", type=int, default=None, help="torch CPU threads (1 gives the steadiest timings on a shared CPU).")
@click.option("--json", "json_out", default=None, help="Write results as JSON to this file.")
@click.option("--markdown", "md_out", default=None, help="Write the tables (and plots) to this Markdown file.")
@click.option("--lean-target/--hf-target", default=True, show_default=True,
              help="Run the target through LightSpec's exact lean forward when it reproduces HF's bit for bit (Llama family); --hf-target forces HF's forward.")
def bench(model, strategies_, draft_model, budgets, prompts_file, suite, limit, max_new_tokens, batch_size, temperature,
          hf_lookup_tokens, no_hf, device, dtype, seed, repeat, batch_repeat, interleave, control, threads, json_out,
          md_out, lean_target):
    """Compare LightSpec strategies with HF transformers generate on the same prompts."""
    from . import bench as bench_mod

    if limit is not None and limit < 1:
        raise InvalidValueError(f"--limit {limit} is invalid: use an integer >= 1 (leave it out for all prompts)")
    _set_threads(threads)

    bench_mod.main(model=model, strategies=list(strategies_), draft_model=draft_model, prompts_file=prompts_file,
                   suite=suite, limit=limit, max_new_tokens=max_new_tokens, batch_size=batch_size,
                   temperature=temperature, hf_lookup_tokens=hf_lookup_tokens, with_hf=not no_hf, device=device,
                   dtype=dtype, json_out=json_out, md_out=md_out, lean_target=lean_target, repeat=repeat, seed=seed,
                   batch_repeat=batch_repeat, interleave=interleave, control=control, budgets=list(budgets))


@cli.command()
@click.argument("stats_file")
@click.option("-o", "--output", "out", default=None, help="HTML file to write (default: STATS_FILE with .html).")
@click.option("--title", default=None, help="Page title (default: LightSpec report).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def report(stats_file, out, title, as_json):
    """Charts of a statistics file (--stats-out, bench's *_stats.jsonl) as one self-contained HTML page."""
    import os

    from .dashboard import write_report

    out = out or os.path.splitext(stats_file)[0] + ".html"
    if os.path.abspath(out) == os.path.abspath(stats_file):
        raise InvalidValueError(f"-o {out!r} is the stats file itself; give another output path")
    info = write_report(stats_file, out, title)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"wrote {out}: {info['steps']} steps, {info['requests']} requests, {info['bytes'] // 1024} KiB", err=True)


def _set_threads(threads: int | None) -> None:
    """``--threads N``: torch's CPU threads (N >= 1); ``None`` leaves torch's default."""
    if threads is None:
        return
    if threads < 1:
        raise InvalidValueError(f"--threads {threads} is invalid: use an integer >= 1")
    import torch

    torch.set_num_threads(threads)


def _add_commands() -> None:
    from .cli_serve import serve

    cli.add_command(serve)


_add_commands()

# click >= 8.2 raises this for a group called without a command (older click prints the help itself)
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def main(argv=None) -> int:
    """Run the ``lightspec`` command line; returns the exit code.  Every error is one
    ``error: ...`` line on stderr, never a traceback unless ``--debug`` is given: 2 for bad
    input (``LightSpecError`` and click's usage errors, e.g. a non-integer option), 1 for
    anything unexpected, 130 when interrupted."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, standalone_mode=False, obj={})
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        return 130
    except _NO_ARGS_IS_HELP as exc:  # `lightspec` alone: the help text, as click prints it
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        click.echo(f"error: {_one_line(exc.format_message())}{where}", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        click.echo(f"error: {_one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except LightSpecError as exc:
        if debug:
            raise
        click.echo(f"error: {_one_line(str(exc))}", err=True)
        return 2
    except Exception as exc:  # anything else: one line unless --debug
        if debug:
            raise
        click.echo(f"error: {type(exc).__name__}: {_one_line(str(exc))} (run with --debug for the traceback)", err=True)
        return 1
    return 0


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


if __name__ == "__main__":
    sys.exit(main())
