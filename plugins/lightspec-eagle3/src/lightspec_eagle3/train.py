"""Training an EAGLE-3 head for any HF causal LM (``lightspec eagle3 train``).

Each step: random windows of the token stream go through the frozen target once
(``output_hidden_states``), the tapped states are fused by ``fc``, and the head is unrolled
``ttt_steps`` drafting steps (``modeling.ttt_logits``, EAGLE-3's training-time test).  The
loss is the cross-entropy against the target's distribution (KL up to a constant) over the
draft vocabulary at every unrolled step, weighted
0.8^(s-1); the target's distribution is renormalised over the draft vocabulary, which is
the ``draft_vocab`` most frequent tokens of the training stream (``d2t``/``t2d``).

The output folder holds the head in the public format (``config.json``,
``model.safetensors``, fp16) and ``training_log.json``, rewritten at every checkpoint, and
``trainer_state.pt`` (fp32 weights, optimizer, data position, RNG) for ``--resume``.
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lightspec_core import InvalidValueError, LightSpecError, load_model, load_tokenizer

from .checkpoint import save_head
from .config import HeadConfig
from .data import draft_vocabulary, load_tokens
from .modeling import Eagle3Head, ttt_logits

STATE = "trainer_state.pt"
LOG = "training_log.json"


@dataclass
class TrainArgs:
    target: str
    data: list[str]
    out: str
    exclude: list[str] = field(default_factory=list)
    draft_vocab: int = 0  # 0: the target's whole vocabulary (no d2t/t2d)
    share_lm_head: bool = False  # no lm_head of its own: the target's (needs draft_vocab 0)
    intermediate_size: int = 0  # 0: the target's
    heads: int = 0  # 0: the target's
    kv_heads: int = 0
    head_dim: int = 0
    norm_before_residual: bool = False
    layer_ids: list[int] | None = None  # eagle_aux_hidden_state_layer_ids (None: the default taps)
    seq_len: int = 256
    batch: int = 8
    ttt_steps: int = 4
    lr: float = 1e-3
    warmup: int = 20
    max_steps: int = 0  # 0: until the time budget
    time_budget_s: float = 0.0  # 0: until max_steps
    checkpoint_every_s: float = 300.0
    max_tokens: int = 0  # use at most this many tokens of the data (0: all)
    device: str = "cpu"
    threads: int = 0  # 0: leave torch's default
    seed: int = 1234
    resume: bool = False

    def check(self) -> None:
        if not self.max_steps and not self.time_budget_s:
            raise InvalidValueError("give --max-steps N or --time-budget-s S (or both): training needs an end")
        if self.share_lm_head and self.draft_vocab:
            raise InvalidValueError(f"--share-lm-head needs the whole vocabulary, but --draft-vocab is {self.draft_vocab}")
        for name in ("seq_len", "batch", "ttt_steps"):
            if getattr(self, name) < 1 or (name == "seq_len" and self.seq_len < self.ttt_steps + 2):
                raise InvalidValueError(f"--{name.replace('_', '-')}={getattr(self, name)} is invalid: use a positive "
                                        "integer (seq_len > ttt_steps + 1)")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise InvalidValueError(f"--device={self.device!r} is invalid: use cpu, cuda or cuda:N")


def _target_mlp_width(c) -> int:
    """The target's MLP width under the names families give it (Llama-style ``intermediate_size``,
    GPT-2's ``n_inner``, OPT's ``ffn_dim``); 4 H where the config leaves it implicit."""
    for name in ("intermediate_size", "n_inner", "ffn_dim"):
        value = getattr(c, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 4 * c.hidden_size


def head_config(target, args: TrainArgs) -> HeadConfig:
    """The new head's config: the target's geometry unless the arguments shrink it."""
    c = target.config
    H = c.hidden_size
    heads = args.heads or c.num_attention_heads
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 10000.0), "rope_type": "default"}
    L = c.num_hidden_layers
    return HeadConfig(
        hidden_size=H,
        intermediate_size=args.intermediate_size or _target_mlp_width(c),
        num_attention_heads=heads,
        num_key_value_heads=args.kv_heads or (getattr(c, "num_key_value_heads", heads) if not args.heads else heads),
        head_dim=args.head_dim or getattr(c, "head_dim", None) or H // heads,
        vocab_size=target.get_output_embeddings().weight.shape[0],
        draft_vocab_size=args.draft_vocab or target.get_output_embeddings().weight.shape[0],
        target_hidden_size=H,
        rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
        max_position_embeddings=getattr(c, "max_position_embeddings", 2048),
        rope={k: v for k, v in dict(rope).items()},
        aux_layer_ids=list(args.layer_ids) if args.layer_ids else (
            None if L >= 5 else [max(0, min(L - 2, i)) for i in (0, L // 2 - 1, L - 2)]),
        norm_before_residual=args.norm_before_residual,
        norm_before_fc=False,
    )


# the arguments that shape a head, and the config field each sets
SHAPE_ARGS = {"draft_vocab": "draft_vocab_size", "intermediate_size": "intermediate_size",
              "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "head_dim": "head_dim",
              "layer_ids": "aux_layer_ids", "norm_before_residual": "norm_before_residual"}


def _refuse_other_shape(args: TrainArgs, saved: HeadConfig, asked: HeadConfig, saved_args: dict) -> None:
    """``--resume`` continues the checkpoint's head: a shape argument given (not left at its
    default) that differs from it is an error naming the field and both values."""
    default = TrainArgs(target="", data=[], out="")
    for arg, name in SHAPE_ARGS.items():
        if getattr(args, arg) != getattr(default, arg) and getattr(asked, name) != getattr(saved, name):
            raise InvalidValueError(f"--resume: the checkpoint's head has {name}={getattr(saved, name)!r}, "
                                    f"--{arg.replace('_', '-')} asks for {getattr(asked, name)!r}; leave "
                                    f"--{arg.replace('_', '-')} out to continue it, or train a new head in another --out")
    if args.share_lm_head and not saved_args.get("share_lm_head"):
        raise InvalidValueError("--resume: the checkpoint's head has its own lm_head, --share-lm-head asks for the "
                                "target's; leave --share-lm-head out to continue it")


def _load_target(path: str, device: str):
    """The target as the pipeline loads it (a folder or hub id; one error line for a bad one),
    without LightSpec's CPU kernels (training reads the plain HF forward), frozen."""
    target = load_model(path, torch.device(device), torch.float32, progress=True, cpu_layout=False)
    tok = load_tokenizer(path, progress=True)
    for p in target.parameters():
        p.requires_grad_(False)
    return tok, target


def _new_head(cfg: HeadConfig, target, args: TrainArgs, vocab_ids: np.ndarray) -> Eagle3Head:
    embed = target.get_input_embeddings().weight
    out = target.get_output_embeddings().weight
    head = Eagle3Head(cfg, own_embed=False, own_lm_head=not args.share_lm_head, embed=embed,
                      lm_head=out if args.share_lm_head else None)
    with torch.no_grad():
        ids = torch.as_tensor(vocab_ids, dtype=torch.long)
        head.d2t.copy_(ids - torch.arange(len(ids)))
        head.t2d.zero_()
        head.t2d[ids] = True
        if head.lm_head is not None:  # start from the target's own output rows
            head.lm_head.weight.copy_(out[ids.to(out.device)])
    return head.to(args.device)


def ttt_loss(head: Eagle3Head, taps: torch.Tensor, t_logits: torch.Tensor, ids: torch.Tensor, steps: int):
    """taps ``[B, T, n·H_t]``, target logits ``[B, T, V]``, ids ``[B, T]`` → (loss, per-step top-1
    agreement with the target's argmax over its whole vocabulary).

    The loss is the cross-entropy against the target's distribution over the draft vocabulary
    (KL up to the target's entropy, a constant), computed once for all steps."""
    draft_ids = head.target_ids()
    full = head.cfg.draft_vocab_size == t_logits.shape[-1]
    with torch.no_grad():
        teacher = torch.softmax((t_logits if full else t_logits[..., draft_ids]).float(), -1)
        t_top = t_logits.argmax(-1)
    losses, agree = [], []
    for s, logits in enumerate(ttt_logits(head, head.fuse(taps), ids, steps), start=1):
        n = logits.shape[1]
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), teacher[:, s: s + n].flatten(0, 1)))
        with torch.no_grad():
            agree.append((draft_ids[logits.argmax(-1)] == t_top[:, s: s + n]).float().mean().item())
    w = [0.8 ** i for i in range(len(losses))]
    return sum(wi * li for wi, li in zip(w, losses)) / sum(w), agree


def _device_name(device: str, threads: int) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.machine()}, {threads} thread(s))"


def train(args: TrainArgs, progress: bool = True) -> dict:
    """Train (or resume) a head as ``args`` say; returns the summary also written to ``training_log.json``."""
    from tqdm import tqdm

    args.check()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidValueError(f"--device={args.device} but torch sees no CUDA device")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok, target = _load_target(args.target, args.device)
    tokens = load_tokens(args.data, tok, args.exclude, args.max_tokens)
    if tokens.size < args.seq_len + 1:
        raise InvalidValueError(f"training data has {tokens.size} tokens, fewer than --seq-len={args.seq_len}")
    state_file = out / STATE
    state = None
    if args.resume:
        if not state_file.is_file():
            raise InvalidValueError(f"--resume: {state_file} does not exist (train without --resume first)")
        state = torch.load(state_file, map_location="cpu", weights_only=False)
        cfg = HeadConfig(**state["config"])
        _refuse_other_shape(args, cfg, head_config(target, args), state["shape_args"])
        vocab_ids = np.asarray(state["vocab_ids"])
    else:
        cfg = head_config(target, args)
        vocab_ids = draft_vocabulary(tokens, cfg.vocab_size, cfg.draft_vocab_size)
    torch.manual_seed(args.seed)
    head = _new_head(cfg, target, args if state is None else TrainArgs(**{**asdict(args), **state["shape_args"]}), vocab_ids)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, seen, log, wall = 0, 0, [], 0.0
    rng = np.random.default_rng(args.seed)
    if state is not None:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, seen, log, wall = state["step"], state["tokens"], state["log"], state["wall_s"]
        rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
    taps = cfg.taps(target.config.num_hidden_layers)
    n_params = sum(p.numel() for p in params)
    shape_args = {"share_lm_head": head.lm_head is None}

    def summary() -> dict:
        return {"args": {k: v for k, v in asdict(args).items() if k != "resume"}, "config": cfg.to_dict(),
                "trainable_params": n_params, "taps": taps, "steps": step, "tokens": seen, "wall_s": round(wall, 1),
                "device": _device_name(args.device, torch.get_num_threads()), "torch": torch.__version__,
                "log": log}

    def checkpoint() -> None:
        torch.save({"config": cfg.to_dict(), "vocab_ids": vocab_ids.tolist(), "head": head.state_dict(),
                    "opt": opt.state_dict(), "step": step, "tokens": seen, "log": log, "wall_s": wall,
                    "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "shape_args": shape_args},
                   state_file)
        save_head(head, out)
        (out / LOG).write_text(json.dumps(summary(), indent=1) + "\n")

    t0 = time.time()
    wall0, last_ck = wall, time.time()
    first_step, last = step, None
    bar = tqdm(total=args.max_steps or None, initial=step, desc="eagle3 train", unit="step", disable=not progress)
    T = args.seq_len
    span = (args.time_budget_s or math.inf)
    while (not args.max_steps or step < args.max_steps) and time.time() - t0 < span:
        starts = rng.integers(0, tokens.size - T, args.batch)
        ids = torch.from_numpy(np.stack([tokens[s: s + T] for s in starts])).to(args.device)
        with torch.no_grad():
            o = target(input_ids=ids, output_hidden_states=True)
            feats = torch.cat([o.hidden_states[i] for i in taps], -1)
        frac = (time.time() - t0) / span if args.time_budget_s else (step - first_step) / max(1, args.max_steps - first_step)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        loss, agree = ttt_loss(head, feats, o.logits, ids, args.ttt_steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        seen += ids.numel()
        wall = wall0 + time.time() - t0
        last = {"step": step, "tokens": seen, "loss": round(loss.item(), 4), "lr": round(lr, 6),
                "agree": [round(a, 3) for a in agree], "s": round(wall, 1)}
        if step % 10 == 0 or step == 1:
            log.append(last)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", agree="/".join(f"{a:.2f}" for a in agree))
        if time.time() - last_ck >= args.checkpoint_every_s:
            checkpoint()
            last_ck = time.time()
    bar.close()
    if last is not None and (not log or log[-1]["step"] != step):
        log.append(last)  # the log always ends with the run's last step
    checkpoint()
    return summary()
