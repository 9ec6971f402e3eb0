"""How well a draft predicts the target where it matters: on the target's own greedy output.

For each benchmark-suite prompt (lightspec_zoo.prompt_sets(), held out from training), the target
writes --new-tokens greedily. Then, at every position of that continuation, the draft drafts a
greedy chain of --k tokens from the same context (the prompt's last --draft-context tokens plus the
target's tokens so far, as LightSpec's draft_model does) and the chain is checked against what the
target actually wrote. Reported per workload:

- top1: the draft's first token equals the target's (the per-token acceptance rate alpha);
- accepted: mean accepted tokens per verify for a chain of k (what a greedy verify would accept);
- tokens/verify: accepted + 1 (the target's own token each verify adds).

Compare drafts on the same target: python zoo/scripts/eval_draft_acceptance.py --draft A --draft B
"""
from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "zoo" / "src" / "lightspec_zoo" / "models"


@torch.no_grad()
def chain_matches(draft, context: torch.Tensor, truth: torch.Tensor, k: int) -> int:
    """context [T] (long), truth [>=1] (the target's next tokens): how many of the draft's k greedy
    tokens from context match truth before the first miss."""
    # transformers renamed the cache argument and output within 5.x (past_key_values -> cache)
    name = "cache" if "cache" in inspect.signature(draft.forward).parameters else "past_key_values"
    out = draft(context[None], use_cache=True)
    cache, n = getattr(out, name), 0
    tok = out.logits[0, -1].argmax()
    for j in range(min(k, truth.numel())):
        if tok != truth[j]:
            break
        n += 1
        out = draft(tok.view(1, 1), use_cache=True, **{name: cache})
        cache, tok = getattr(out, name), out.logits[0, -1].argmax()
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(MODELS / "target"))
    ap.add_argument("--draft", action="append", help="draft HF folder (repeatable; default: the zoo draft)")
    ap.add_argument("--limit", type=int, default=8, help="prompts per workload")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--draft-context", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import lightspec_zoo
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    drafts = args.draft or [str(MODELS / "draft")]
    sets = {w: ps[:args.limit] for w, ps in lightspec_zoo.prompt_sets().items()}

    cases = []  # (workload, prompt ids [P], continuation [N])
    for w, prompts in sets.items():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            with torch.no_grad():
                seq = target.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, top_k=None, top_p=None,
                                      pad_token_id=tok.pad_token_id)
            cases.append((w, ids[0], seq[0, ids.size(1):]))

    results = {}
    for d in drafts:
        draft = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        per = {}
        for w, ids, cont in cases:
            s = per.setdefault(w, {"positions": 0, "top1": 0, "accepted": 0})
            for i in range(cont.numel()):
                ctx = torch.cat([ids, cont[:i]])[-args.draft_context:]
                n = chain_matches(draft, ctx, cont[i:], args.k)
                s["positions"] += 1
                s["top1"] += n > 0
                s["accepted"] += n
        per["all"] = {key: sum(s[key] for s in per.values()) for key in ("positions", "top1", "accepted")}
        for s in per.values():  # counts -> rates
            s["top1"] = round(s["top1"] / s["positions"], 4)
            s["accepted"] = round(s["accepted"] / s["positions"], 4)
        results[d] = per
        print(f"\n{d} (k={args.k})")
        print(f"{'workload':12s} {'top1':>6s} {'accepted':>9s} {'tokens/verify':>14s}")
        for w, s in per.items():
            print(f"{w:12s} {s['top1']:6.3f} {s['accepted']:9.3f} {s['accepted'] + 1:14.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
