"""Training a DSpark drafter from a target's hidden states (``lightspec dspark train``).

Data: windows of ``prompt_len`` tokens from a text corpus, each continued by the target itself
(``gen_len`` greedy tokens: on-policy, generated once and kept in ``OUT/data.pt``).  A step runs
the target over a batch of sequences (hidden states of the tapped layers and its logits, no
gradient), samples ``anchors`` block starts per sequence in the generated part (the target's side, tapped
states in fp16 and its top-32 next-token probabilities, is computed once and kept in
``OUT/targets.pt`` unless ``cache_targets`` is off), drafts every
block in one forward of the drafter (each block sees the context before its anchor and its own
slots) and minimises, per block slot k (weight ``exp(-k / block_size)``),
``KL(p_target || p_draft)`` (p_target: the target's top-32, renormalised) with the Markov bias teacher-forced on the true previous tokens,
plus ``BCE(confidence, 1 - 0.5 * |p_draft - p_target|_1)`` for the confidence head.

``OUT`` holds the public checkpoint (``config.json``, ``model.safetensors`` in ``save_dtype``),
``trainer_state.pt`` (fp32 weights, optimizer, step, elapsed time: ``resume``) and
``training_log.json``.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from lightspec_core import InvalidValueError

from .checkpoint import new_drafter, save_drafter, target_config_dict
from .config import DSparkConfig

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")
# folders of a Python installation that are not its standard library's own text (as the zoo's corpus)
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
MAX_FILE_BYTES = 300_000


@dataclass
class TrainArgs:
    out: str
    data: list[str]
    exclude: list[str] = field(default_factory=list)
    block_size: int = 6
    num_layers: int = 1
    intermediate_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    target_layer_ids: list[int] | None = None
    markov_rank: int = 4
    markov_head_type: str = "vanilla"
    confidence_head: bool = True
    mask_token_id: int | None = None
    prompt_len: int = 64
    gen_len: int = 64
    sequences: int = 4096
    batch_size: int = 16
    anchors: int = 16
    lr: float = 3e-3
    steps: int = 100_000
    time_budget_s: float | None = None
    stop_at: int | None = None  # stop (and save) at this step; the schedule still spans ``steps``
    save_every: int = 200
    seed: int = 0
    device: str = "cpu"
    save_dtype: str = "float16"
    resume: bool = False
    progress: bool = True
    cache_targets: bool = True  # run the target over the data once (taps in fp16 + top-k) instead of every step
    topk: int = 32
    sequences_from: str | None = None  # a token stream of prompt + continuation sequences (instead of generating)


def default_taps(num_layers: int) -> list[int]:
    """A middle and the last layer of the target (DeepSpec ids: ``hidden_states[id + 1]``)."""
    return sorted({max(0, num_layers // 2 - 1), num_layers - 1})


def read_corpus(paths: list[str], tokenizer, exclude: list[str]) -> list[list[int]]:
    """Token lists of every text file under ``paths`` (folders: ``*.py, *.txt, *.md, *.rst``;
    ``.jsonl``: the ``text`` field of each line), skipping files whose path ends with an entry of
    ``exclude`` (or with that entry less its first folder), files over 300 kB and folders named in
    ``SKIP_DIRS`` (site-packages, tests)."""
    ends = [e for x in exclude for e in (x, x.split("/", 1)[-1]) if e]
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"--data {p}: no such file or folder")
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix in TEXT_SUFFIXES + (".jsonl",) and f.is_file()
                            and not SKIP_DIRS & set(f.relative_to(p).parts) and f.stat().st_size <= MAX_FILE_BYTES)
        else:
            files.append(p)
    docs = []
    for f in files:
        if any(str(f).endswith(e) for e in ends):
            continue
        text = f.read_text(errors="replace")
        texts = [json.loads(line).get("text", "") for line in text.splitlines() if line.strip()] if f.suffix == ".jsonl" else [text]
        docs += [tokenizer(t)["input_ids"] for t in texts if t]
    if not docs:
        raise ValueError(f"--data {paths}: no text found")
    return docs


@torch.inference_mode()
def make_sequences(target, docs: list[list[int]], args: TrainArgs, device, progress) -> torch.Tensor:
    """``[n, prompt_len + gen_len]``: random corpus windows, each continued greedily by the target."""
    rng = random.Random(args.seed)
    long_docs = [d for d in docs if len(d) > args.prompt_len]
    if not long_docs:
        raise ValueError(f"no document is longer than --prompt-len {args.prompt_len} tokens")
    weights = [len(d) for d in long_docs]
    prompts = []
    for _ in range(args.sequences):
        d = rng.choices(long_docs, weights)[0]
        s = rng.randrange(0, len(d) - args.prompt_len)
        prompts.append(d[s : s + args.prompt_len])
    out = []
    bs = 64
    bar = progress(total=args.sequences, desc="target continuations", unit="seq")
    for i in range(0, len(prompts), bs):
        ids = torch.tensor(prompts[i : i + bs], device=device)
        gen = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=args.gen_len, min_new_tokens=args.gen_len,
                              eos_token_id=None, pad_token_id=0)
        out.append(gen.cpu())
        bar.update(len(ids))
    bar.close()
    return torch.cat(out)


def read_sequences(path: str, args: TrainArgs, eot: int | None) -> torch.Tensor:
    """``[n, prompt_len + gen_len]`` from a token file of fixed-length records, each a sequence
    of ``prompt_len + gen_len`` tokens followed by ``eot`` (``.bin`` uint16 or ``.npy``; what
    ``zoo/scripts/make_onpolicy_data.py`` writes: a window of the corpus, then the target's
    continuation).  The trainer takes each record's last ``gen_len`` tokens as the target's own,
    so a file whose records do not have that layout is refused; at most ``sequences`` records
    are used (a seeded random subset)."""
    import numpy as np

    from lightspec_core import InvalidValueError

    f = Path(path)
    if not f.is_file() or f.suffix not in (".bin", ".npy"):
        raise InvalidValueError(f"--sequences-from {path!r}: not a .bin (uint16) or .npy token file")
    if eot is None:
        raise InvalidValueError("--sequences-from needs a tokenizer with an end-of-text token (the record separator)")
    arr = np.fromfile(f, dtype=np.uint16) if f.suffix == ".bin" else np.load(f).reshape(-1)
    n = args.prompt_len + args.gen_len
    if arr.size == 0 or arr.size % (n + 1) or not bool((arr.reshape(-1, n + 1)[:, -1] == eot).all()):
        raise InvalidValueError(f"--sequences-from {path!r}: its {arr.size} tokens are not records of --prompt-len + "
                                f"--gen-len = {n} tokens each followed by the end-of-text token {eot}")
    seqs = torch.from_numpy(arr.reshape(-1, n + 1)[:, :n].astype(np.int64))
    if args.sequences < len(seqs):
        seqs = seqs[torch.randperm(len(seqs), generator=torch.Generator().manual_seed(args.seed))[: args.sequences]]
    return seqs


def build_config(target, args: TrainArgs) -> DSparkConfig:
    t = target.config
    taps = args.target_layer_ids or default_taps(t.num_hidden_layers)
    params = getattr(t, "rope_parameters", None) or {}
    theta = params.get("rope_theta") or getattr(t, "rope_theta", None) or 10000.0
    return DSparkConfig(
        hidden_size=t.hidden_size, intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads, head_dim=args.head_dim,
        vocab_size=t.vocab_size, block_size=args.block_size, target_layer_ids=taps,
        mask_token_id=args.mask_token_id if args.mask_token_id is not None else (t.pad_token_id or 0),
        rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6), rope_theta=float(theta), markov_rank=args.markov_rank,
        markov_head_type=args.markov_head_type, enable_confidence_head=args.confidence_head,
        confidence_head_with_markov=args.confidence_head and args.markov_rank > 0)


# the arguments that shape a drafter, and the config field each sets
SHAPE_ARGS = {"block_size": "block_size", "num_layers": "num_hidden_layers", "intermediate_size": "intermediate_size",
              "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
              "target_layer_ids": "target_layer_ids", "markov_rank": "markov_rank",
              "markov_head_type": "markov_head_type", "confidence_head": "enable_confidence_head",
              "mask_token_id": "mask_token_id"}
CLI_NAMES = {"num_layers": "layers", "num_heads": "heads", "num_kv_heads": "kv-heads", "target_layer_ids": "taps"}


def _refuse_other_shape(args: TrainArgs, saved: DSparkConfig, asked: DSparkConfig) -> None:
    """``--resume`` continues the checkpoint's drafter: a shape argument given (not left at
    its default) that differs from it is an error naming the field and both values."""
    default = TrainArgs(out="", data=[])
    for arg, name in SHAPE_ARGS.items():
        if getattr(args, arg) != getattr(default, arg) and getattr(asked, name) != getattr(saved, name):
            flag = "--" + CLI_NAMES.get(arg, arg.replace("_", "-"))
            raise InvalidValueError(f"--resume: the checkpoint's drafter has {name}={getattr(saved, name)!r}, {flag} "
                                    f"asks for {getattr(asked, name)!r}; leave {flag} out to continue it, or train a new "
                                    "drafter in another --out")


def block_mask(anchors: torch.Tensor, T: int, gamma: int) -> torch.Tensor:
    """``[B, 1, nb * gamma, T + nb * gamma]``: slot of block i sees context columns ``< anchors[:, i]``
    and the slots of block i."""
    B, nb = anchors.shape
    q = nb * gamma
    blk = torch.arange(q, device=anchors.device) // gamma
    ctx = torch.arange(T, device=anchors.device)[None, None, :] < anchors[:, blk][..., None]
    own = blk[:, None] == blk[None, :]
    return torch.cat([ctx, own[None].expand(B, q, q)], dim=-1)[:, None]


@torch.no_grad()
def target_batch(target, seqs: torch.Tensor, layer_ids: list[int], lo: int, topk: int):
    """The target's side of a batch ``seqs [B, S]``: ``taps [B, S, L * H]`` (the tapped states,
    concatenated) and its next-token distribution at positions ``lo .. S - 1`` as the top ``topk``
    ``(ids [B, S - lo, k], probs [B, S - lo, k])`` (probabilities of the full softmax)."""
    out = target(input_ids=seqs, attention_mask=torch.ones_like(seqs), output_hidden_states=True,
                 logits_to_keep=seqs.shape[1] - lo)
    taps = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    probs, ids = out.logits.float().softmax(-1).topk(min(topk, out.logits.shape[-1]), dim=-1)
    return taps, ids, probs


def step_loss(drafter, seqs: torch.Tensor, taps, t_ids, t_probs, lo: int, args: TrainArgs, gen: torch.Generator):
    """``(loss, metrics)`` of one batch ``seqs [B, S]`` with the target's side from :func:`target_batch`.
    The target distribution is its top-k, renormalised (k = ``TOPK``: the rest is below the
    draft's resolution and would cost a [B, S, V] copy of the target's logits per sequence)."""
    cfg, gamma = drafter.cfg, drafter.cfg.block_size
    B, S = seqs.shape
    taps = taps.to(seqs.device).float()
    hi = S - gamma - 1
    nb = min(args.anchors, hi - lo + 1)
    anchors = torch.stack([torch.randperm(hi - lo + 1, generator=gen)[:nb] + lo for _ in range(B)]).sort(-1).values
    anchors = anchors.to(seqs.device)
    offs = torch.arange(gamma, device=seqs.device)
    pos = (anchors[..., None] + offs).reshape(B, nb * gamma)  # slot positions
    ids = torch.full((B, nb, gamma), cfg.mask_token_id, dtype=torch.long, device=seqs.device)
    ids[:, :, 0] = seqs.gather(1, anchors)
    feats = drafter.features(taps)
    ctx_kv = drafter.context_kv(feats, torch.arange(S, device=seqs.device).expand(B, S))
    h = drafter.backbone(ids.reshape(B, -1), pos, ctx_kv, block_mask(anchors, S, gamma))
    prev = seqs.gather(1, pos).reshape(B, nb, gamma)  # x_{a+k}: the token before slot k's label
    h4 = h.reshape(B, nb, gamma, -1)
    logits = drafter.base_logits(h4)
    if drafter.markov_head is not None:
        logits = logits + drafter.markov_head.block_bias(prev, h4)
    k = t_ids.shape[-1]
    rel = (pos - lo)[..., None].expand(-1, -1, k).to(t_ids.device)
    tid = t_ids.gather(1, rel).to(seqs.device).long().reshape(B, nb, gamma, k)
    tp = t_probs.gather(1, rel).to(seqs.device).float().reshape(B, nb, gamma, k)
    tp = tp / tp.sum(-1, keepdim=True)
    logp_d = logits.float().log_softmax(-1)
    at = logp_d.gather(-1, tid)
    kl = (tp * (tp.clamp_min(1e-12).log() - at)).sum(-1)  # [B, nb, gamma]
    w = torch.exp(-offs.float() / gamma)
    loss = (kl * w).mean(0).mean(0).sum() / w.sum()
    metrics = {"kl": float(kl.detach().mean())}
    conf = drafter.confidence_logit(h4, prev)
    if conf is not None:
        pd = at.exp()
        tv = 0.5 * ((pd - tp).abs().sum(-1) + (1 - pd.sum(-1)).clamp(min=0))
        c_loss = F.binary_cross_entropy_with_logits(conf.float(), (1 - tv).detach().clamp(0, 1))
        loss = loss + c_loss
        metrics["confidence_bce"] = float(c_loss.detach())
    with torch.no_grad():
        match = (logits.argmax(-1) == tid[..., 0]).float()  # teacher-forced greedy agreement
        metrics["acc_per_slot"] = [round(float(x), 4) for x in match.mean((0, 1))]
        metrics["accepted_len_tf"] = float(match.cumprod(-1).sum(-1).mean()) + 1.0
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def train(target, tokenizer, args: TrainArgs, progress=None, log=print) -> dict:
    """Train (or resume) into ``args.out``; returns the final log entry."""
    from tqdm import tqdm

    progress = progress or (lambda **kw: tqdm(disable=not args.progress, **kw))
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target.to(device).eval().requires_grad_(False)
    state_path = out / "trainer_state.pt"
    resumed = args.resume and state_path.is_file()
    if args.resume and not resumed:
        raise FileNotFoundError(f"--resume: {state_path} does not exist (train without --resume first)")
    state = torch.load(state_path, map_location="cpu", weights_only=False) if resumed else None
    cfg = DSparkConfig(**state["config"]) if resumed else build_config(target, args)
    if resumed:
        _refuse_other_shape(args, cfg, build_config(target, args))
    drafter = new_drafter(target, cfg, seed=args.seed).to(device)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, weight_decay=0.0)
    data_path = out / "data.pt"
    if data_path.is_file():
        seqs = torch.load(data_path)
    else:
        if args.sequences_from:
            seqs = read_sequences(args.sequences_from, args, tokenizer.eos_token_id)
        else:
            seqs = make_sequences(target, read_corpus(args.data, tokenizer, args.exclude), args, device, progress)
        torch.save(seqs, data_path)
    lo = max(1, args.prompt_len - 1)
    cache = None
    if args.cache_targets:
        cache_path = out / "targets.pt"
        if cache_path.is_file():
            cache = torch.load(cache_path)
        else:
            parts = []
            bar = progress(total=len(seqs), desc="target states", unit="seq")
            for i in range(0, len(seqs), args.batch_size):
                taps, tid, tp = target_batch(target, seqs[i : i + args.batch_size].to(device), cfg.target_layer_ids, lo, args.topk)
                parts.append((taps.half().cpu(), tid.short().cpu() if tid.max() < 32768 else tid.cpu(), tp.half().cpu()))
                bar.update(len(taps))
            bar.close()
            cache = tuple(torch.cat([p[j] for p in parts]) for j in range(3))
            torch.save(cache, cache_path)
    history: list[dict] = []
    step, elapsed = 0, 0.0
    if resumed:
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, elapsed, history = state["step"], state["elapsed_s"], state["history"]
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(args.seed))

    def sched(s: int) -> float:
        """Warm-up over 100 steps, then cosine to 10% over the steps or the time budget, whichever ends first."""
        done = s / max(1, args.steps)
        if args.time_budget_s:
            done = max(done, (time.perf_counter() - t_start) / args.time_budget_s)
        return min(1.0, (s + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))

    t_start = time.perf_counter() - elapsed
    bar = progress(total=args.steps, initial=step, desc="dspark train", unit="step")
    meta = {"target": str(getattr(target.config, "_name_or_path", "")), "args": asdict(args),
            "sequences": int(len(seqs)), "sequence_tokens": int(seqs.shape[1])}

    def save():
        drafter_state = {k: v.detach().cpu() for k, v in drafter.state_dict().items()}
        torch.save({"config": asdict(cfg), "model": drafter_state, "optimizer": opt.state_dict(), "step": step,
                    "elapsed_s": time.perf_counter() - t_start, "history": history}, out / "trainer_state.tmp")
        (out / "trainer_state.tmp").replace(state_path)
        save_drafter(drafter, out, target_config_dict(target), dtype=getattr(torch, args.save_dtype))
        (out / "training_log.json").write_text(json.dumps({**meta, "steps": step, "wall_s": round(time.perf_counter() - t_start, 1),
                                                           "history": history}, indent=1) + "\n")

    drafter.train()
    last: dict = {}
    while step < args.steps:
        if args.time_budget_s is not None and time.perf_counter() - t_start >= args.time_budget_s:
            break
        if args.stop_at is not None and step >= args.stop_at:
            break
        i = (step * args.batch_size) % len(seqs)
        idx = order[torch.arange(i, i + args.batch_size) % len(seqs)]
        for g in opt.param_groups:
            g["lr"] = args.lr * sched(step)
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)  # per step: a resumed run draws the same anchors
        batch = seqs[idx].to(device)
        side = tuple(t[idx] for t in cache) if cache is not None else target_batch(target, batch, cfg.target_layer_ids, lo, args.topk)
        loss, metrics = step_loss(drafter, batch, *side, lo, args, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        last = {"step": step, "elapsed_s": round(time.perf_counter() - t_start, 1), **metrics}
        if step % 10 == 0 or step == 1:
            history.append(last)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc_len=f"{metrics['accepted_len_tf']:.2f}")
        if step % args.save_every == 0:
            save()
    bar.close()
    if last and (not history or history[-1] is not last):
        history.append(last)
    save()
    return {"step": step, **(history[-1] if history else {})}
