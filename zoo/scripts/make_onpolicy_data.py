"""On-policy distillation data for the draft: the target's own continuations of training-set prompts.

A draft is only ever asked to predict what the *target* writes next, in contexts the target wrote
itself. Distilling on the pre-training text alone teaches the draft the corpus, not the target's
habits (its repetitions, how it copies, where it stops). This script takes random windows of the
training token stream (zoo/build/tokens-copy/train.bin by default, never the held-out set), lets
the target continue each one (greedy for most, temperature 0.8 for the rest, as the benchmark
suite does), and writes prompt + continuation, separated by <|endoftext|>, as a new token stream
that train.py reads with --data. The held-out eval.bin is copied unchanged so that eval losses
stay comparable across runs.

Resumable: each batch is appended to train.bin as it finishes; run it again to add more, up to
--tokens. Deterministic for a given --seed and batch count.

  python zoo/scripts/make_onpolicy_data.py --target zoo/src/lightspec_zoo/models/target \
      --out zoo/build/tokens-onpolicy --tokens 2000000 --time-budget-s 1500
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "zoo" / "src" / "lightspec_zoo" / "models" / "target"))
    ap.add_argument("--source", default=str(ROOT / "zoo" / "build" / "tokens-copy"),
                    help="token folder whose train.bin gives the prompts and whose eval.bin is copied")
    ap.add_argument("--out", default=str(ROOT / "zoo" / "build" / "tokens-onpolicy"))
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--sampled-every", type=int, default=3,
                    help="every Nth batch samples at --temperature instead of greedy (0 = never)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--tokens", type=int, default=2_000_000, help="stop once train.bin holds this many")
    ap.add_argument("--time-budget-s", type=float, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    if args.prompt_len < 1 or args.new_tokens < 1 or args.batch_size < 1:
        raise SystemExit("--prompt-len, --new-tokens and --batch-size must be >= 1")

    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    source, out = Path(args.source), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "eval.bin", out / "eval.bin")
    stream = np.memmap(source / "train.bin", dtype=np.uint16, mode="r")
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    eot = int(model.config.eos_token_id)

    train_path = out / "train.bin"
    seq_len = args.prompt_len + args.new_tokens + 1  # + the separator
    done_batches = (train_path.stat().st_size // 2 // seq_len) // args.batch_size if train_path.exists() else 0
    # Drop a partly written batch so that batches stay aligned with their seeds.
    with open(train_path, "ab") as f:
        f.truncate(done_batches * args.batch_size * seq_len * 2)

    total = args.tokens // (seq_len * args.batch_size)
    start = time.time()
    bar = tqdm(total=total, initial=done_batches, unit="batch", desc="on-policy data")
    for b in range(done_batches, total):
        if args.time_budget_s is not None and time.time() - start > args.time_budget_s:
            break
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + b)
        starts = torch.randint(0, len(stream) - args.prompt_len, (args.batch_size,), generator=gen).tolist()
        prompts = torch.from_numpy(np.stack([stream[s:s + args.prompt_len].astype(np.int64) for s in starts]))
        sampled = args.sampled_every > 0 and b % args.sampled_every == args.sampled_every - 1
        if sampled:
            torch.manual_seed(args.seed * 7919 + b)
        with torch.no_grad():
            seqs = model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                  max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                  do_sample=sampled, temperature=args.temperature if sampled else None,
                                  top_k=None, top_p=None, pad_token_id=eot, eos_token_id=None)
        rows = torch.cat([seqs, torch.full((seqs.size(0), 1), eot)], 1).numpy().astype(np.uint16)
        with open(train_path, "ab") as f:
            f.write(rows.tobytes())
        bar.update(1)
    bar.close()

    n = train_path.stat().st_size // 2
    meta = {
        "vocab_size": int(model.config.vocab_size), "dtype": "uint16", "eot_id": eot,
        "train": {"tokens": int(n), "sequences": int(n // seq_len), "prompt_len": args.prompt_len,
                  "new_tokens": args.new_tokens, "sampled_every": args.sampled_every,
                  "temperature": args.temperature, "seed": args.seed,
                  "prompts_from": str(args.source),
                  "sha256": hashlib.sha256(train_path.read_bytes()).hexdigest()},
        "eval": json.loads((source / "meta.json").read_text())["eval"],
        "made_by": "zoo/scripts/make_onpolicy_data.py",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"{out}/train.bin: {n:,} tokens ({n // seq_len:,} sequences) in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
