"""Run on a CUDA machine: lossless greedy checks of every built-in strategy against HF
``generate`` on several tiny architectures, in fp32 and bf16, at batch 1 and 8.

    python scripts/gpu_checks.py --json out.json

fp32 must be token-identical; in bf16 a k-token verify forward and a 1-token forward can
round differently and flip a near-tied argmax, so bf16 mismatches are reported, not failed.
Each row also says which target forward ran (``lean`` when the load-time probe found the
lean forward bit-for-bit equal to HF's on this GPU and dtype, else ``hf``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ARCHS = {
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
    "mistral": dict(model_type="mistral", hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=3, n_head=4),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4),
    "opt": dict(model_type="opt", hidden_size=64, ffn_dim=128, num_hidden_layers=3, num_attention_heads=4, word_embed_proj_dim=64),
}


class Tok:
    """The pipeline needs a tokenizer only to decode; prompts are token ids here."""

    eos_token_id = None

    def __len__(self):
        return 512

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def build(arch: str, seed: int, device, dtype, layers=None):
    kw = dict(ARCHS[arch])
    mt = kw.pop("model_type")
    if layers:
        for k in ("num_hidden_layers", "n_layer"):
            if k in kw:
                kw[k] = layers
    cfg = AutoConfig.for_model(mt, vocab_size=512, max_position_embeddings=512, initializer_range=0.2,
                               bos_token_id=None, eos_token_id=None, pad_token_id=None, **kw)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).to(device=device, dtype=dtype).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--archs", default=",".join(ARCHS))
    args = ap.parse_args()
    from lightspec_core.pipeline import MTPPipeline

    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    base = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 7, 12, 20, 5, 31, 9, 16)]
    prompts = [p + p[: len(p) // 2] + p for p in base]  # repetitive, so n-gram lookup drafts too
    rows = []
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for arch in args.archs.split(","):
            target = build(arch, 0, dev, dtype)
            draft = build(arch, 1, dev, dtype, layers=1)
            with torch.inference_mode():
                ref = []
                for p in prompts:
                    ids = torch.tensor([p], device=dev)
                    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                          min_new_tokens=args.new, do_sample=False, pad_token_id=0)
                    ref.append(out[0, len(p):].tolist())
            for strat, extra in [("none", {}), ("ngram", {}), ("draft_model", {"draft_model": draft}),
                                 ("layerskip", {"layers": 1}), ("hybrid", {"draft_model": draft})]:
                for static in (False, True):
                    budget = {"type": "static", "k": 4} if static else None
                    pipe = MTPPipeline(target, Tok(), strategy=strat if "layers" not in extra else strat,
                                       budget=budget, **({k: v for k, v in extra.items() if k == "draft_model"}),
                                       **({"layers": 1} if strat == "layerskip" else {}))
                    for bs in (1, 8):
                        t0 = time.perf_counter()
                        got = []
                        for i in range(0, len(prompts), bs):
                            got += [r.token_ids for r in pipe.generate(prompts[i:i + bs], max_new_tokens=args.new, ignore_eos=True)]
                        if dev.type == "cuda":
                            torch.cuda.synchronize()
                        same = sum(a == b for a, b in zip(got, ref))
                        acc = sum(s.accepted for s in pipe.results_stats())
                        rows.append(dict(dtype=str(dtype).replace("torch.", ""), arch=arch, strategy=strat,
                                         budget="static4" if static else "dynamic", batch=bs, identical=same,
                                         total=len(prompts), accepted_in_last_batch=acc,
                                         target_forward=pipe.engine.target_forward,
                                         seconds=round(time.perf_counter() - t0, 3)))
                        print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for r in rows:
        k = r["dtype"]
        s = summary.setdefault(k, [0, 0])
        s[0] += r["identical"]
        s[1] += r["total"]
    print("SUMMARY identical outputs:", {k: f"{a}/{b}" for k, (a, b) in summary.items()})
    if args.json:
        json.dump({"rows": rows, "summary": summary, "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                   "torch": torch.__version__}, open(args.json, "w"), indent=1)
    fp32 = summary.get("float32", [0, 1])
    return 0 if fp32[0] == fp32[1] else 1


if __name__ == "__main__":
    sys.exit(main())
