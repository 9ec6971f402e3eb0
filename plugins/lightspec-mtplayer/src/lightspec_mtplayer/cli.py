"""``lightspec mtplayer train``: train MTP modules or Medusa heads for a target.

torch and transformers are imported inside the command, so ``lightspec --help`` stays fast.
Errors are one line without a traceback unless ``lightspec --debug``.
"""

from __future__ import annotations

import json

import click

from lightspec_core import LightSpecError


@click.group("mtplayer")
def mtplayer():
    """MTP modules and Medusa heads (the lightspec-mtplayer plugin)."""


@mtplayer.command("train")
@click.option("--target", "target", default=None, help="Target model: a folder or hub id (default: the lightspec-zoo target).")
@click.option("--kind", type=click.Choice(["mtp", "medusa"]), default="mtp", show_default=True,
              help="mtp: DeepSeek-style MTP modules; medusa: parallel Medusa heads.")
@click.option("--out", required=True, help="Output folder: the head (public format), training_log.json, checkpoint.pt.")
@click.option("--data", multiple=True, required=True,
              help="Training data (repeatable): a uint16 .bin token file, a folder with train.bin, or text files/folders.")
@click.option("--heads", type=int, default=3, show_default=True, help="Medusa heads.")
@click.option("--head-layers", type=int, default=1, show_default=True, help="Residual blocks per Medusa head.")
@click.option("--mtp-layers", type=int, default=1, show_default=True, help="MTP modules.")
@click.option("--own-head/--shared-head", default=False, show_default=True,
              help="Give the head its own [V, H] output matrix instead of using the target's lm_head.")
@click.option("--unroll", type=int, default=3, show_default=True, help="MTP: drafting steps trained per position.")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--batch", type=int, default=8, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--warmup", type=int, default=20, show_default=True, help="Warm-up steps (then cosine decay to 10%).")
@click.option("--max-steps", type=int, default=1000, show_default=True)
@click.option("--time-budget-s", type=float, default=0.0, show_default=True,
              help="Stop (and save) after this many seconds of this run (0: no limit).")
@click.option("--save-every", type=int, default=100, show_default=True, help="Checkpoint every N steps.")
@click.option("--log-every", type=int, default=10, show_default=True, help="Record loss and agreement every N steps.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--threads", type=int, default=None, help="torch CPU threads.")
@click.option("--save-dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True)
@click.option("--resume", is_flag=True, help="Continue from OUT/checkpoint.pt.")
@click.option("--json", "as_json", is_flag=True, help="Print the training summary as JSON.")
def train_cmd(target, kind, out, data, heads, head_layers, mtp_layers, own_head, unroll, seq_len, batch, lr, warmup,
              max_steps, time_budget_s, save_every, log_every, seed, device, threads, save_dtype, resume, as_json):
    """Train MTP modules or Medusa heads for TARGET from its own hidden states (distillation)."""
    import torch

    from .train import TrainConfig, train

    if threads is not None:
        if threads < 1:
            raise LightSpecError(f"--threads {threads} is invalid: use an integer >= 1")
        torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LightSpecError(f"--device {device}: CUDA is not available on this machine (use cpu)")
    if device != "cpu" and not device.startswith("cuda"):
        raise LightSpecError(f"--device {device!r} is invalid: use cpu or cuda")
    if target is None:
        try:
            import lightspec_zoo
        except ImportError:
            raise LightSpecError("no --target given and lightspec-zoo is not installed: pass --target PATH") from None
        target = str(lightspec_zoo.model_path())
    cfg = TrainConfig(target=target, out=out, data=list(data), kind=kind, heads=heads, head_layers=head_layers,
                      mtp_layers=mtp_layers, own_head=own_head, unroll=unroll, seq_len=seq_len, batch=batch, lr=lr,
                      warmup=warmup, max_steps=max_steps, time_budget_s=time_budget_s, save_every=save_every,
                      log_every=log_every, seed=seed,
                      device=device, save_dtype=save_dtype)
    log = train(cfg, resume=resume)
    last = log["train"][-1] if log["train"] else {}
    summary = {"out": out, "kind": kind, "steps": log["steps"], "tokens": log["tokens"], "stopped": log["stopped"],
               "elapsed_s": round(log["elapsed_s"], 1), "loss": last.get("loss"), "agreement": last.get("agreement")}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"{kind} head -> {out}: {summary['steps']} steps, {summary['tokens']:,} tokens, "
                   f"{summary['elapsed_s']} s ({summary['stopped']}), loss {summary['loss']}, "
                   f"top-1 agreement {summary['agreement']}")
