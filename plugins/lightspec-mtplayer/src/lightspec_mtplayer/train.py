"""Training MTP modules or Medusa heads for a frozen target from its own hidden states.

Each batch is ``batch`` windows of ``seq_len`` tokens of the training data, run once through
the frozen target (``output_hidden_states``: the final-norm states ``h`` ``[B, T, H]`` and the
target's logits).  Every loss is a distillation: the head's distribution against the target's
own next-token distribution at the same place (KL), so the head learns what the target would
say, which is what a verifier accepts.

* Medusa head i (0-based) reads ``h_p`` and is trained towards the target's distribution at
  ``p + 1 + i`` (it drafts the token after the next one, then the one after that, ...).
* MTP module, unrolled ``unroll`` steps as the drafter runs it (``drafter.py``): step 1 at
  index p reads ``(x_{p+1}, h_p)``; step s > 1 reads ``(x_{p+1}, out_{s-1}[p-1])`` (the
  previous step's output one place earlier: the chain's state) and attends to the step-1
  keys of indices ``<= p - s + 1`` and to its own chain's keys of steps 2..s; every step is
  trained towards the target's distribution at ``p + 1``.  Step s uses module ``(s-1) mod n``.

Checkpoints (``checkpoint.pt``: weights, optimizer, step, data position, log) are written every
``save_every`` steps and at the end; ``resume`` continues from one.  The result is saved in the
public format (``formats.save_mtp_layers`` / ``save_medusa``) with ``training_log.json``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lightspec_core import LightSpecError, load_model, load_tokenizer

from .formats import save_medusa, save_mtp_layers
from .modules import MedusaHeads, MTPLayer

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainConfig:
    target: str
    out: str
    data: list[str]
    kind: str = "mtp"  # "mtp" | "medusa"
    heads: int = 3  # Medusa heads
    head_layers: int = 1  # residual blocks per Medusa head
    mtp_layers: int = 1  # MTP modules
    own_head: bool = False  # an own [V, H] head (else the target's lm_head)
    unroll: int = 3  # MTP: drafting steps trained per position
    seq_len: int = 256
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 20
    max_steps: int = 1000
    time_budget_s: float = 0.0  # 0: no limit
    save_every: int = 100
    log_every: int = 10
    seed: int = 0
    device: str = "cpu"
    save_dtype: str = "float16"
    extra: dict = field(default_factory=dict)

    def check(self) -> None:
        if self.kind not in ("mtp", "medusa"):
            raise LightSpecError(f"kind={self.kind!r} is invalid: use 'mtp' or 'medusa'")
        for name in ("heads", "head_layers", "mtp_layers", "unroll", "seq_len", "batch", "max_steps", "save_every",
                     "log_every", "warmup"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise LightSpecError(f"{name}={value!r} is invalid: use an integer >= 1")
        if self.seq_len < self.unroll + 2 or (self.kind == "medusa" and self.seq_len < self.heads + 2):
            raise LightSpecError(f"seq_len={self.seq_len} is too short for this many drafting steps")
        if not self.lr > 0:
            raise LightSpecError(f"lr={self.lr!r} is invalid: use a number > 0")
        if self.save_dtype not in ("float16", "bfloat16", "float32"):
            raise LightSpecError(f"save_dtype={self.save_dtype!r} is invalid: use float16, bfloat16 or float32")


# -- data -------------------------------------------------------------------------------------

TEXT_SUFFIXES = (".txt", ".py", ".md", ".rst")


def load_tokens(paths: list[str], tokenizer) -> np.ndarray:
    """Training tokens from ``paths``: ``.bin`` files of uint16 token ids (the zoo's format),
    folders holding ``train.bin``, or text files / folders of text files (``*.txt``, ``*.py``,
    ``*.md``, ``*.rst``, sorted) tokenized with the target's tokenizer, documents separated by
    its end-of-text token."""
    parts = []
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    for raw in paths:
        p = Path(raw)
        if p.is_dir() and (p / "train.bin").is_file():
            p = p / "train.bin"
        if p.suffix == ".bin" and p.is_file():
            parts.append(np.fromfile(p, dtype=np.uint16).astype(np.int64))
            continue
        files = sorted(f for f in p.rglob("*") if f.suffix in TEXT_SUFFIXES) if p.is_dir() else [p]
        if not files or not all(f.is_file() for f in files):
            raise LightSpecError(f"--data {raw}: no such file, or a folder without train.bin or text files")
        for f in files:
            ids = tokenizer(f.read_text(encoding="utf-8", errors="replace"))["input_ids"]
            parts.append(np.asarray(list(ids) + [eos], dtype=np.int64))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return tokens


def batch_at(tokens: np.ndarray, step: int, cfg: TrainConfig) -> torch.Tensor:
    """The windows of step ``step`` ``[batch, seq_len]``: a function of (seed, step) only, so a
    resumed run sees exactly the batches it would have seen."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(tokens) - cfg.seq_len, cfg.batch)
    return torch.from_numpy(np.stack([tokens[s : s + cfg.seq_len] for s in starts]))


# -- losses -----------------------------------------------------------------------------------


def _kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean KL(teacher || student) over rows, top-1 agreement) for ``[n, V]`` logits."""
    lp = F.log_softmax(student_logits.float(), -1)
    lt = F.log_softmax(teacher_logits.float(), -1)
    kl = F.kl_div(lp, lt, log_target=True, reduction="batchmean")
    agree = (student_logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean()
    return kl, agree


def medusa_loss(heads: MedusaHeads, h: torch.Tensor, logits: torch.Tensor):
    """Sum over heads of ``0.8^i`` x KL; per-head agreement.  ``h [B, T, H]``, ``logits [B, T, V]``."""
    T = h.shape[1]
    total, agree = 0.0, []
    for i in range(heads.num_heads):
        n = T - 1 - i  # indices p with a teacher at p + 1 + i
        x = heads.heads[i](h[:, :n])
        out = heads.lm_heads[i](x) if heads.own_heads else heads._target_head(x)
        kl, a = _kl(out.reshape(-1, out.shape[-1]), logits[:, 1 + i : 1 + i + n].reshape(-1, logits.shape[-1]))
        total = total + (0.8 ** i) * kl
        agree.append(float(a))
    return total, agree


def unroll_mask(T: int, s: int, device) -> torch.Tensor:
    """Step ``s``'s attention ``[T, s*T]`` over [step-1 keys, step-2 keys, ..., step-s keys]:
    query p sees step-1 keys ``<= p - s + 1`` and step r's key at ``p - s + r`` (its chain)."""
    p = torch.arange(T, device=device)[:, None]
    c = torch.arange(T, device=device)[None, :]
    blocks = [c <= p - s + 1]
    blocks += [c == p - s + r for r in range(2, s + 1)]
    m = torch.cat(blocks, dim=1)
    m[:, (s - 1) * T :] |= torch.eye(T, dtype=torch.bool, device=device)  # a query always sees itself
    return m


def mtp_loss(layers: list[MTPLayer], ids: torch.Tensor, h: torch.Tensor, logits: torch.Tensor, unroll: int):
    """Sum over unrolled steps of ``0.8^(s-1)`` x KL (module docstring); per-step agreement.

    Every module runs every step (each keeps its own keys of the whole chain, as in the
    drafter); step s drafts with module ``(s-1) mod n``, whose output is the chain's state."""
    from transformers import DynamicCache

    B, T = ids.shape
    n = T - 1  # indices p = 0 .. T-2 (token x_{p+1} exists)
    tok = ids[:, 1:]
    pos = torch.arange(n, device=ids.device)[None].expand(B, n)
    teacher = logits[:, 1:]
    V = logits.shape[-1]
    caches = [DynamicCache() for _ in layers]
    state = h[:, :n]
    total, agree = 0.0, []
    for s in range(1, unroll + 1):
        mask = unroll_mask(n, s, ids.device)[None, None].expand(B, 1, n, s * n)
        outs = [layer(tok, state, pos, mask, cache=cache) for layer, cache in zip(layers, caches)]
        use = (s - 1) % len(layers)
        out = outs[use]
        kl, a = _kl(layers[use].head(out[:, s - 1 :]).reshape(-1, V), teacher[:, s - 1 :].reshape(-1, V))
        total = total + (0.8 ** (s - 1)) * kl
        agree.append(float(a))
        # the chain's state for the next step: this step's output one index earlier
        state = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
    return total, agree


# -- the loop ---------------------------------------------------------------------------------


def build_head(target, cfg: TrainConfig):
    """Fresh, trainable head modules for ``target`` (a list of ``MTPLayer`` or ``MedusaHeads``)."""
    torch.manual_seed(cfg.seed)
    if cfg.kind == "medusa":
        heads = MedusaHeads(target, cfg.heads, cfg.head_layers, own_heads=cfg.own_head)
        heads.zero_init()
        return heads
    L = target.config.num_hidden_layers
    layers = [MTPLayer(target, L + i, own_head=cfg.own_head) for i in range(cfg.mtp_layers)]
    for layer in layers:
        if cfg.own_head:
            layer.shared_head.head.weight.data.copy_(target.get_output_embeddings().weight.data)
        # the block's norms start as the target's final norm does (ones); RMSNorm modules already do
    return torch.nn.ModuleList(layers)


def _lr(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to 10% over ``max_steps``."""
    frac = min(1.0, step / max(1, cfg.max_steps))
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(cfg: TrainConfig, resume: bool = False, progress: bool = True) -> dict:
    """Train (or continue training) a head for ``cfg.target``; return the training log.
    Writes ``cfg.out``: the head in the public format, ``training_log.json`` and ``checkpoint.pt``."""
    from tqdm import tqdm

    cfg.check()
    out = Path(cfg.out)
    ckpt_path = out / CHECKPOINT
    state = None
    if resume:
        if not ckpt_path.is_file():
            raise LightSpecError(f"--resume: no checkpoint at {ckpt_path}")
        state = torch.load(str(ckpt_path), map_location="cpu", weights_only=False)
        saved = TrainConfig(**state["config"])
        for name in ("target", "kind", "heads", "head_layers", "mtp_layers", "own_head"):
            if getattr(saved, name) != getattr(cfg, name):
                raise LightSpecError(f"--resume: the checkpoint was trained with {name}={getattr(saved, name)!r}, "
                                     f"this run asks for {getattr(cfg, name)!r}")
    device = torch.device(cfg.device)
    target = load_model(cfg.target, device, torch.float32, progress=True, cpu_layout=False)
    tokenizer = load_tokenizer(cfg.target, progress=True)
    for p in target.parameters():
        p.requires_grad_(False)
    tokens = load_tokens(cfg.data, tokenizer)
    if len(tokens) <= cfg.seq_len:
        raise LightSpecError(f"--data holds {len(tokens)} tokens: need more than seq_len={cfg.seq_len}")
    V = target.config.vocab_size
    if int(tokens.max()) >= V:
        raise LightSpecError(f"--data has token id {int(tokens.max())}, outside the target's vocabulary (0..{V - 1})")
    head = build_head(target, cfg).to(device)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    log = {"config": asdict(cfg), "data_tokens": int(len(tokens)), "train": [], "elapsed_s": 0.0, "tokens": 0}
    step = 0
    if state is not None:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, log = state["step"], state["log"]
        log["config"] = asdict(cfg)
    L = target.config.num_hidden_layers
    start, elapsed0 = time.perf_counter(), log["elapsed_s"]
    bar = tqdm(total=cfg.max_steps, initial=step, desc=f"mtplayer train ({cfg.kind})", disable=not progress,
               dynamic_ncols=True)
    stop_reason, last = "max_steps", None
    while step < cfg.max_steps:
        ids = batch_at(tokens, step, cfg).to(device)
        with torch.no_grad():
            res = target(input_ids=ids, output_hidden_states=True)
        h, logits = res.hidden_states[L], res.logits
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step)
        if cfg.kind == "medusa":
            loss, agree = medusa_loss(head, h, logits)
        else:
            loss, agree = mtp_loss(list(head), ids, h, logits, cfg.unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        log["tokens"] += ids.numel()
        log["elapsed_s"] = elapsed0 + time.perf_counter() - start
        last = {"step": step, "tokens": log["tokens"], "elapsed_s": round(log["elapsed_s"], 1),
                "lr": _lr(cfg, step - 1), "loss": round(float(loss.detach()), 4),
                "agreement": [round(a, 4) for a in agree]}
        if step % cfg.log_every == 0 or step == 1:
            log["train"].append(last)
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", agree="/".join(f"{a:.2f}" for a in agree))
        if step % cfg.save_every == 0:
            _checkpoint(ckpt_path, head, opt, step, log, cfg)
        # checked after a step, so that every run (and every resumed run) makes progress
        if cfg.time_budget_s and step < cfg.max_steps and time.perf_counter() - start >= cfg.time_budget_s:
            stop_reason = "time_budget"
            break
    bar.close()
    if last is not None and (not log["train"] or log["train"][-1]["step"] != step):
        log["train"].append(last)  # the log always ends with the run's last step
    log["stopped"] = stop_reason
    log["steps"] = step
    _checkpoint(ckpt_path, head, opt, step, log, cfg)
    _export(head, target, cfg, log)
    return log


def _checkpoint(path: Path, head, opt, step: int, log: dict, cfg: TrainConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "log": log, "config": asdict(cfg)},
               str(tmp))
    tmp.replace(path)


def _export(head, target, cfg: TrainConfig, log: dict) -> None:
    dtype = getattr(torch, cfg.save_dtype)
    out = Path(cfg.out)
    if cfg.kind == "medusa":
        save_medusa(head, target.config, out, dtype=dtype, extra=cfg.extra)
    else:
        save_mtp_layers(list(head), target.config, out, dtype=dtype, extra=cfg.extra)
    params = sum(p.numel() for p in head.parameters())
    summary = {k: v for k, v in log.items() if k != "config"}
    summary.update({"kind": cfg.kind, "params": params, "target": cfg.target, "device": cfg.device,
                    "torch": torch.__version__, "settings": {k: v for k, v in asdict(cfg).items()
                                                             if k not in ("target", "out", "extra")}})
    (out / "training_log.json").write_text(json.dumps(summary, indent=1) + "\n")
