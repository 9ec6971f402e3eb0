#!/usr/bin/env python3
"""Experiment: would an EAGLE-3 style draft head beat the zoo draft model on the zoo target?

Not product code (the eagle3 plugin's own issue builds the real drafter, its checkpoint format
and trainer). This answers one question before that work starts: on the target's own greedy
output, how many tokens does a light head that reads the target's hidden states get accepted
per verify, against the 2.46M-parameter distilled draft model (zoo/scripts/eval_draft_acceptance.py
protocol: k=6 greedy chain at every position of the target's 64-token continuation)?

The head (trainable ~2.7M parameters; the target's tied embedding / lm_head is reused, frozen):
  g_t = fc([h_low; h_mid; h_high]_t)                          target features at position t
  x   = [rmsnorm(embed(token_{t+1})); rmsnorm(g_t)]           [2H]
  h   = g_t + attn(x) ;  h = h + mlp(rmsnorm(h))              one Llama block, q/k/v read 2H
  logits = lm_head(rmsnorm(h))                                predicts token_{t+2}
Drafting step s > 1 feeds the head's own output h of the previous step in place of g (EAGLE-3).

Training ("training-time test", EAGLE-3): the head is unrolled for --steps steps over a whole
sequence at once. Step s at index t reads the step-(s-1) output at t and token_{t+s}, sits at
position t+s-1, attends causally to the step-1 keys of indices <= t and to its own earlier
steps' keys at index t (the entries a real draft chain would have in its cache), and is
trained towards the target's distribution at position t+s (KL, soft labels).

Usage:
  python zoo/scripts/exp_eagle_head.py train --out zoo/build/exp/eagle-head --time-budget-s 1800
  python zoo/scripts/exp_eagle_head.py eval --head zoo/build/exp/eagle-head
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "zoo" / "src" / "lightspec_zoo" / "models"


def feature_layers(n_layers: int) -> tuple[int, int, int]:
    """Which ``hidden_states`` the head reads (low, middle, high): for the zoo target's 7 blocks,
    the outputs of blocks 2 and 4 and the final (normed) output, (2, 4, 7)."""
    return max(1, n_layers // 3), max(1, 2 * n_layers // 3), n_layers


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, heads, T, D] rotated by positions pos [T] (HF's half-split convention)."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    half = D // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Head(nn.Module):
    def __init__(self, hidden: int, heads: int, inter: int, theta: float, n_feat: int = 3):
        super().__init__()
        self.nh, self.theta = heads, theta
        self.fc = nn.Linear(n_feat * hidden, hidden, bias=False)
        self.norm_e, self.norm_g = nn.RMSNorm(hidden, eps=1e-5), nn.RMSNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(2 * hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = nn.RMSNorm(hidden, eps=1e-5)
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.norm_out = nn.RMSNorm(hidden, eps=1e-5)

    def qkv_of(self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        """emb, g [B, T, H] → q, k, v [B, heads, T, D] (q, k rotated to positions pos [T])."""
        B, T, _ = g.shape
        x = torch.cat([self.norm_e(emb), self.norm_g(g)], -1)
        q, k, v = self.qkv(x).view(B, T, 3, self.nh, -1).permute(2, 0, 3, 1, 4)
        return rope(q, pos, self.theta), rope(k, pos, self.theta), v

    def finish(self, g: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Residual stream g [B, T, H] plus attention output att [B, heads, T, D] → h [B, T, H]."""
        B, T, _ = g.shape
        h = g + self.o(att.transpose(1, 2).reshape(B, T, -1))
        a, b = self.gate_up(self.norm2(h)).chunk(2, -1)
        return h + self.down(F.silu(a) * b)


def target_features(target, ids: torch.Tensor):
    """ids [B, T] → (fused features [B, T, 3H], target logits [B, T, V])."""
    out = target(ids, output_hidden_states=True)
    layers = feature_layers(target.config.num_hidden_layers)
    return torch.cat([out.hidden_states[i] for i in layers], -1), out.logits


def ttt_forward(head: Head, embed: torch.Tensor, lm_head: torch.Tensor, feats: torch.Tensor, ids: torch.Tensor,
                steps: int) -> list[torch.Tensor]:
    """The head unrolled for ``steps`` drafting steps over whole sequences (module docstring).

    feats [B, T, 3H], ids [B, T] → one logits tensor per step s = 1..steps, [B, T - s, V]: at index
    t, the prediction of token t+s+1 (to compare with the target's logits at position t+s)."""
    B, T = ids.shape
    g = head.fc(feats)  # [B, T, H]
    keys, vals, out = [], [], []
    idx = torch.arange(T)
    for s in range(1, steps + 1):
        n = T - s  # indices t with a label at position t + s
        if n <= 1:
            break
        emb = F.embedding(ids[:, s : s + n], embed)  # token_{t+s}
        res = g[:, :n]
        q, k, v = head.qkv_of(emb, res, idx[:n] + s - 1)
        keys.append(k)
        vals.append(v)
        # step 1: causal over its own keys; step s: + the key of every later step at the same index
        K = torch.cat([kk[:, :, :n] for kk in keys], 2)
        V = torch.cat([vv[:, :, :n] for vv in vals], 2)
        causal = idx[:n, None] >= idx[None, :n]
        diag = torch.eye(n, dtype=torch.bool)
        mask = torch.cat([causal] + [diag] * (len(keys) - 1), 1)
        h = head.finish(res, F.scaled_dot_product_attention(q, K, V, attn_mask=mask))
        out.append(F.linear(head.norm_out(h), lm_head))
        g = h  # the next step reads this step's output as its feature
    return out


def ttt_loss(head: Head, embed, lm_head, feats, tlogits, ids, steps: int):
    """KL(target || head) per unrolled step, weighted 0.8^(s-1). Returns (loss, per-step top-1 agreement)."""
    losses, agree = [], []
    for s, logits in enumerate(ttt_forward(head, embed, lm_head, feats, ids, steps), start=1):
        n = logits.shape[1]
        teacher = tlogits[:, s : s + n]
        lp = F.log_softmax(logits, -1)
        losses.append(F.kl_div(lp, F.log_softmax(teacher, -1), log_target=True, reduction="batchmean") / n)
        agree.append((logits.argmax(-1) == teacher.argmax(-1)).float().mean().item())
    w = [0.8 ** i for i in range(len(losses))]
    return sum(wi * li for wi, li in zip(w, losses)) / sum(w), agree


def load_target(path):
    from transformers import AutoModelForCausalLM

    t = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return t


def make_head(target) -> Head:
    c = target.config
    return Head(c.hidden_size, c.num_attention_heads, c.intermediate_size, c.rope_parameters["rope_theta"]
                if getattr(c, "rope_parameters", None) else c.rope_theta)


def train(args) -> None:
    from tqdm import tqdm

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    head = make_head(target)
    embed = target.get_input_embeddings().weight
    lm_head = target.get_output_embeddings().weight
    data = np.memmap(Path(args.data) / "train.bin", dtype=np.uint16, mode="r")
    seqlen = args.seq_len
    nseq = len(data) // seqlen
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, seen, log = 0, 0, []
    ck = out / "ckpt.pt"
    if ck.exists():
        st = torch.load(ck, weights_only=False)
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        step, seen, log = st["step"], st["seen"], st["log"]
        torch.set_rng_state(st["rng"])
    rng = np.random.default_rng(args.seed + step)
    t0 = time.time()
    bar = tqdm(total=args.time_budget_s, unit="s", desc="eagle head")
    while time.time() - t0 < args.time_budget_s:
        rows = rng.integers(0, nseq, args.batch)
        ids = torch.from_numpy(np.stack([data[r * seqlen : (r + 1) * seqlen].astype(np.int64) for r in rows]))
        with torch.no_grad():
            feats, tlogits = target_features(target, ids)
        frac = min(1.0, (time.time() - t0) / args.time_budget_s)
        lr = args.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gp in opt.param_groups:
            gp["lr"] = lr
        loss, agree = ttt_loss(head, embed, lm_head, feats, tlogits, ids, args.steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        seen += ids.numel()
        if step % 10 == 0:
            log.append({"step": step, "tokens": seen, "loss": round(loss.item(), 4), "agree": [round(a, 3) for a in agree],
                        "s": round(time.time() - t0, 1)})
            bar.set_postfix(loss=f"{loss.item():.3f}", agree="/".join(f"{a:.2f}" for a in agree), tok=seen)
        bar.n = int(time.time() - t0)
        bar.refresh()
        if step % 100 == 0:
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "seen": seen, "log": log,
                        "rng": torch.get_rng_state()}, ck)
    bar.close()
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "seen": seen, "log": log,
                "rng": torch.get_rng_state()}, ck)
    torch.save(head.state_dict(), out / "head.pt")
    (out / "train_log.json").write_text(json.dumps({"args": vars(args), "steps": step, "tokens": seen, "log": log}, indent=1))
    print(f"done: {step} steps, {seen} tokens, {time.time() - t0:.0f} s")


@torch.no_grad()
def chain_logits(head: Head, embed, lm_head, feats: torch.Tensor, ids: torch.Tensor, fed: torch.Tensor):
    """Yield the logits [V] of each step of a draft chain, as a drafter would run it after the target
    has run over ids[:, :-1] (feats [1, L-1, 3H] are its features there) and emitted ids[:, -1]: first
    the prediction of the token after ids[:, -1], then, after each token of fed [n], the next one."""
    L = ids.shape[1]
    g = head.fc(feats)  # [1, L-1, H]; entry t reads feature t and token t+1
    q, K, V = head.qkv_of(F.embedding(ids[:, 1:], embed), g, torch.arange(L - 1))
    h = head.finish(g, F.scaled_dot_product_attention(q, K, V, is_causal=True))[:, -1:]
    yield F.linear(head.norm_out(h), lm_head)[0, -1]
    for j, tok in enumerate(fed.tolist()):
        q1, k1, v1 = head.qkv_of(F.embedding(torch.tensor([[tok]]), embed), h, torch.tensor([L - 1 + j]))
        K, V = torch.cat([K, k1], 2), torch.cat([V, v1], 2)
        h = head.finish(h, F.scaled_dot_product_attention(q1, K, V))
        yield F.linear(head.norm_out(h), lm_head)[0, -1]


def head_chain(head: Head, embed, lm_head, feats: torch.Tensor, ids: torch.Tensor, truth: torch.Tensor, k: int) -> int:
    """How many of the k greedy tokens of the chain (``chain_logits``) match truth [>=1] before the first miss."""
    n = 0
    for j, logits in enumerate(chain_logits(head, embed, lm_head, feats, ids, truth[: k - 1])):
        if j >= min(k, truth.numel()) or int(logits.argmax()) != int(truth[j]):
            break
        n += 1
    return n


def evaluate(args) -> None:
    import lightspec_zoo
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.target)
    target = load_target(args.target)
    head = make_head(target)
    head.load_state_dict(torch.load(Path(args.head) / "head.pt"))
    head.eval()
    embed = target.get_input_embeddings().weight
    lm_head = target.get_output_embeddings().weight
    per = {}
    for w, prompts in lightspec_zoo.prompt_sets().items():
        for p in prompts[: args.limit]:
            ids = tok(p, return_tensors="pt").input_ids
            with torch.no_grad():
                seq = target.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, top_k=None, top_p=None,
                                      pad_token_id=tok.pad_token_id)
                feats, _ = target_features(target, seq)
            P = ids.shape[1]
            cont = seq[0, P:]
            s = per.setdefault(w, {"positions": 0, "top1": 0, "accepted": 0})
            for i in range(1, cont.numel()):  # the target's last emitted token is cont[i-1]
                L = P + i
                n = head_chain(head, embed, lm_head, feats[:, : L - 1], seq[:, :L], cont[i:], args.k)
                s["positions"] += 1
                s["top1"] += n > 0
                s["accepted"] += n
    per["all"] = {key: sum(s[key] for s in per.values()) for key in ("positions", "top1", "accepted")}
    for s in per.values():
        s["top1"] = round(s["top1"] / s["positions"], 4)
        s["accepted"] = round(s["accepted"] / s["positions"], 4)
    print(f"{'workload':12s} {'top1':>6s} {'accepted':>9s}")
    for w, s in per.items():
        print(f"{w:12s} {s['top1']:6.3f} {s['accepted']:9.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": per}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--target", default=str(MODELS / "target"))
    t.add_argument("--data", default=str(ROOT / "zoo" / "build" / "tokens-onpolicy"))
    t.add_argument("--out", required=True)
    t.add_argument("--seq-len", type=int, default=224)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--steps", type=int, default=3, help="unrolled drafting steps (training-time test)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--time-budget-s", type=float, default=1800)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--seed", type=int, default=1234)
    e = sub.add_parser("eval")
    e.add_argument("--target", default=str(MODELS / "target"))
    e.add_argument("--head", required=True)
    e.add_argument("--limit", type=int, default=8)
    e.add_argument("--new-tokens", type=int, default=64)
    e.add_argument("--k", type=int, default=6)
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--json", default=None)
    args = ap.parse_args()
    train(args) if args.cmd == "train" else evaluate(args)


if __name__ == "__main__":
    main()
