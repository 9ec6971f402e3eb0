"""``lightspec eagle3 ...``: the plugin's commands (registered through ``lightspec_register_commands``).

torch is imported inside the commands, so ``lightspec --help`` stays fast."""

from __future__ import annotations

import json

import click


@click.group("eagle3")
def eagle3():
    """EAGLE-3 draft heads: train one for a target, restrict one to a smaller draft vocabulary."""


def _ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r}: use comma-separated layer ids, e.g. 1,3,5") from None


@eagle3.command("train")
@click.option("--target", "target", required=True, help="HF model folder or id of the target (its tokenizer too).")
@click.option("--data", "data", multiple=True, required=True,
              help="Training text: files/folders (.py .txt .md .rst .jsonl) or token arrays (.bin uint16, .npy). Repeatable.")
@click.option("--exclude", multiple=True, help="Glob pattern or path suffix (relative to a --data folder) to leave out. Repeatable.")
@click.option("--out", required=True, help="Output folder: the head (public format), training_log.json, trainer_state.pt.")
@click.option("--draft-vocab", type=int, default=0, show_default=True,
              help="Draft vocabulary: the N most frequent tokens of the data (d2t/t2d); 0: the whole vocabulary.")
@click.option("--share-lm-head", is_flag=True, help="No lm_head of its own: use the target's (needs --draft-vocab 0).")
@click.option("--intermediate-size", type=int, default=0, show_default=True, help="MLP width (0: the target's).")
@click.option("--heads", type=int, default=0, show_default=True, help="Attention heads (0: the target's).")
@click.option("--kv-heads", type=int, default=0, show_default=True, help="KV heads (0: as many as --heads, or the target's).")
@click.option("--head-dim", type=int, default=0, show_default=True, help="Head dimension (0: the target's).")
@click.option("--layer-ids", default=None,
              help="eagle_aux_hidden_state_layer_ids, e.g. 1,3,5 (id i = output of block i); default: hidden_states[2, L//2, L-3].")
@click.option("--norm-before-residual", is_flag=True, help="Residual from hidden_norm(feature) (the speculators variant).")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--batch", type=int, default=8, show_default=True)
@click.option("--ttt-steps", type=int, default=4, show_default=True, help="Unrolled drafting steps (training-time test).")
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--max-steps", type=int, default=0, show_default=True, help="Stop after this many optimizer steps (0: no limit).")
@click.option("--time-budget-s", type=float, default=0.0, show_default=True,
              help="Stop after this many seconds of this run (0: no limit).")
@click.option("--checkpoint-every-s", type=float, default=300.0, show_default=True)
@click.option("--max-tokens", type=int, default=0, show_default=True, help="Read at most this many tokens of the data.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--threads", type=int, default=0, show_default=True, help="torch CPU threads (0: torch's default).")
@click.option("--seed", type=int, default=1234, show_default=True)
@click.option("--resume", is_flag=True, help="Continue from OUT/trainer_state.pt (same data, budget counted afresh).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def train_cmd(as_json, data, exclude, layer_ids, **options):
    """Train an EAGLE-3 head for TARGET (training-time test, reduced draft vocabulary, checkpoints)."""
    from .train import TrainArgs, train

    args = TrainArgs(data=list(data), exclude=list(exclude), layer_ids=_ids(layer_ids), **options)
    summary = train(args)
    if as_json:
        click.echo(json.dumps({k: v for k, v in summary.items() if k != "log"}, indent=1))
    else:
        last = summary["log"][-1] if summary["log"] else {}
        click.echo(f"saved {args.out}: {summary['steps']} steps, {summary['tokens']:,} tokens, "
                   f"{summary['wall_s']:.0f} s, {summary['trainable_params']:,} trainable parameters; "
                   f"last loss {last.get('loss')}, top-1 agreement per step {last.get('agree')}")


@eagle3.command("shrink-vocab")
@click.option("--head", "head_dir", required=True, help="The head to restrict (any public layout): a folder or hub id.")
@click.option("--target", "target", required=True, help="HF model folder or id of the head's target (its tokenizer too).")
@click.option("--data", "data", multiple=True, required=True,
              help="Text or token arrays (.bin uint16, .npy) whose token frequencies choose the kept tokens; ideally "
                   "the target's own outputs. Repeatable.")
@click.option("--draft-vocab", type=int, required=True, help="How many tokens to keep (the most frequent in --data).")
@click.option("--out", required=True, help="Output folder for the restricted head (public format, d2t/t2d).")
@click.option("--max-tokens", type=int, default=0, show_default=True, help="Read at most this many tokens of the data.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def shrink_cmd(head_dir, target, data, draft_vocab, out, max_tokens, as_json):
    """Restrict a trained head to the DRAFT_VOCAB most frequent tokens (a cheaper lm_head, no retraining)."""
    from lightspec_core import model_folder

    from .data import load_tokens
    from .shrink import shrink_vocab
    from .train import _load_target

    tok, model = _load_target(target, "cpu")
    tokens = load_tokens(list(data), tok, max_tokens=max_tokens)
    summary = shrink_vocab(model_folder(head_dir, what="EAGLE-3 head", progress=True), model, tokens, draft_vocab, out)
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    else:
        click.echo(f"saved {summary['out']}: draft vocabulary {summary['was']} -> {summary['draft_vocab_size']} tokens, "
                   f"covering {100 * summary['coverage']:.1f}% of the {summary['tokens_counted']:,} tokens counted")
