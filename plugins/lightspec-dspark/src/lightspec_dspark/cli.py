"""``lightspec dspark ...``: the plugin's CLI commands (``train``, ``shrink-vocab``).  Heavy imports happen inside
the commands, so ``lightspec --help`` stays fast."""

from __future__ import annotations

import json

import click


@click.group("dspark")
def dspark():
    """DSpark block drafters: train one for a target."""


@dspark.command("train")
@click.option("--target", required=True, help="The target model: a folder or hub id ('zoo' = the zoo target).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder (the checkpoint).")
@click.option("--data", multiple=True, help="Text corpus: folders (*.py, *.txt, *.md, *.rst), files or .jsonl "
              "(field 'text'). Default for the zoo target: the CPython stdlib the zoo was trained on.")
@click.option("--exclude-list", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A file of paths (one a line) to leave out (default for the zoo target: its held-out files).")
@click.option("--block-size", default=6, show_default=True, type=click.IntRange(1, 64))
@click.option("--layers", "num_layers", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option("--intermediate-size", default=64, show_default=True, type=click.IntRange(1))
@click.option("--heads", "num_heads", default=4, show_default=True, type=click.IntRange(1))
@click.option("--kv-heads", "num_kv_heads", default=2, show_default=True, type=click.IntRange(1))
@click.option("--head-dim", default=32, show_default=True, type=click.IntRange(2))
@click.option("--taps", default=None, help="Target layer ids, comma-separated (id = HF hidden_states[id+1]); "
              "default: a middle and the last layer.")
@click.option("--markov-rank", default=4, show_default=True, type=click.IntRange(0))
@click.option("--markov-head-type", default="vanilla", show_default=True, type=click.Choice(["vanilla", "gated", "rnn"]))
@click.option("--confidence-head/--no-confidence-head", default=True, show_default=True)
@click.option("--mask-token-id", default=None, type=click.IntRange(0), help="Default: the target's pad token (or 0).")
@click.option("--prompt-len", default=64, show_default=True, type=click.IntRange(1))
@click.option("--gen-len", default=64, show_default=True, type=click.IntRange(2))
@click.option("--sequences", default=4096, show_default=True, type=click.IntRange(1),
              help="Corpus windows the target continues (on-policy data, made once).")
@click.option("--sequences-from", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Token file (.bin uint16 / .npy) of records of --prompt-len + --gen-len tokens, each followed by "
                   "the end-of-text token (zoo/scripts/make_onpolicy_data.py), used instead of generating sequences.")
@click.option("--batch-size", default=16, show_default=True, type=click.IntRange(1))
@click.option("--anchors", default=16, show_default=True, type=click.IntRange(1), help="Blocks per sequence per step.")
@click.option("--lr", default=3e-3, show_default=True, type=float)
@click.option("--steps", default=100_000, show_default=True, type=click.IntRange(1))
@click.option("--time-budget-s", default=None, type=float, help="Stop (and save) after this many seconds of training.")
@click.option("--stop-at", default=None, type=click.IntRange(1),
              help="Stop (and save) at this step; the learning-rate schedule still spans --steps (resume later).")
@click.option("--save-every", default=200, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:i].")
@click.option("--threads", default=None, type=click.IntRange(1), help="torch CPU threads.")
@click.option("--save-dtype", default="float16", show_default=True, type=click.Choice(["float16", "bfloat16", "float32"]))
@click.option("--resume", is_flag=True, help="Continue from OUT/trainer_state.pt.")
@click.option("--json", "as_json", is_flag=True, help="Print the final log entry as JSON.")
def train_cmd(target, out, data, exclude_list, taps, threads, as_json, **opts):
    """Train a DSpark drafter for TARGET from its hidden states (writes the public DeepSpec format)."""
    import torch

    from lightspec_core import InvalidValueError, load_model, load_tokenizer

    from .train import TrainArgs, train

    if threads:
        torch.set_num_threads(threads)
    exclude: list[str] = []
    if target == "zoo":
        import lightspec_zoo

        target = str(lightspec_zoo.model_path())
        if exclude_list is None:
            exclude_list = str(lightspec_zoo.PROMPTS_DIR / "heldout_files.txt")
        if not data:
            import sysconfig

            data = (sysconfig.get_paths()["stdlib"],)
    if not data and not opts["sequences_from"]:
        raise InvalidValueError("--data (or --sequences-from) is required for a target other than 'zoo'")
    if exclude_list:
        exclude = [ln.strip() for ln in open(exclude_list) if ln.strip()]
    try:
        layer_ids = [int(x) for x in taps.split(",")] if taps else None
    except ValueError:
        raise InvalidValueError(f"--taps {taps!r} is invalid: use comma-separated integers, e.g. 2,6") from None
    if opts["device"].startswith("cuda") and not torch.cuda.is_available():
        raise InvalidValueError(f"--device {opts['device']}: CUDA is not available here (use cpu)")
    model = load_model(target, torch.device("cpu"), torch.float32, progress=True, cpu_layout=False)
    tokenizer = load_tokenizer(target, progress=True)
    if opts["num_heads"] % opts["num_kv_heads"]:
        raise InvalidValueError(f"--heads {opts['num_heads']} is not a multiple of --kv-heads {opts['num_kv_heads']}")
    args = TrainArgs(out=out, data=list(data), exclude=exclude, target_layer_ids=layer_ids, **opts)
    result = train(model, tokenizer, args)
    click.echo(json.dumps(result) if as_json else
               f"saved {out} after {result['step']} steps (teacher-forced accepted length "
               f"{result.get('accepted_len_tf', float('nan')):.2f})")


@dspark.command("shrink-vocab")
@click.option("--drafter", "folder", required=True, help="The DSpark / DFlash checkpoint to restrict: a folder or hub id.")
@click.option("--target", required=True, help="The drafter's target: a folder or hub id ('zoo' = the zoo target).")
@click.option("--data", multiple=True, required=True,
              help="Token files (.bin uint16, .npy) or text files whose token frequencies choose the kept tokens; "
                   "ideally the target's own outputs. Repeatable.")
@click.option("--draft-vocab", type=click.IntRange(1), required=True,
              help="How many tokens to keep (the most frequent in --data).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder (public layout with d2t).")
@click.option("--max-tokens", default=0, show_default=True, type=click.IntRange(0),
              help="Read at most this many tokens of the data (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def shrink_cmd(folder, target, data, draft_vocab, out, max_tokens, as_json):
    """Restrict a trained drafter to the DRAFT_VOCAB most frequent tokens (a cheaper lm_head, no retraining)."""
    from pathlib import Path

    import numpy as np
    import torch

    from lightspec_core import InvalidValueError, load_model, load_tokenizer, model_folder

    from .shrink import shrink_vocab

    if target == "zoo":
        import lightspec_zoo

        target = str(lightspec_zoo.model_path())
    model = load_model(target, torch.device("cpu"), torch.float32, progress=True, cpu_layout=False)
    tokenizer = None
    parts = []
    for path in data:
        p = Path(path)
        if not p.is_file():
            raise InvalidValueError(f"--data {path!r}: no such file")
        if p.suffix == ".bin":
            parts.append(np.fromfile(p, dtype=np.uint16).astype(np.int64))
        elif p.suffix == ".npy":
            parts.append(np.load(p).reshape(-1).astype(np.int64))
        else:
            tokenizer = tokenizer or load_tokenizer(target)
            parts.append(np.asarray(tokenizer(p.read_text(errors="replace"))["input_ids"], dtype=np.int64))
    tokens = np.concatenate(parts)
    if max_tokens:
        tokens = tokens[:max_tokens]
    summary = shrink_vocab(model_folder(folder, what="DSpark/DFlash checkpoint", progress=True), model, tokens,
                           draft_vocab, out)
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    else:
        click.echo(f"saved {summary['out']}: draft vocabulary {summary['was']} -> {summary['draft_vocab_size']} tokens, "
                   f"covering {100 * summary['coverage']:.1f}% of the {summary['tokens_counted']:,} tokens counted")
