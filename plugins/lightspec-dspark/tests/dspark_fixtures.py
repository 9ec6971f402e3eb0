"""Test fixtures: tiny random HF targets and tiny random DSpark / DFlash checkpoints written in
the public DeepSpec layout *by hand* (key names and shapes spelled out here, not taken from the
plugin's modules, so the loader is checked against the format, not against itself)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

torch.set_num_threads(1)

VOCAB = 96


def tiny_target(arch: str = "qwen3", seed: int = 0, vocab: int = VOCAB, layers: int = 3):
    """A tiny fp32 causal LM (hidden 32) in eval mode; HF ``generate`` never stops early."""
    import transformers

    cls = {"qwen3": "Qwen3Config", "llama": "LlamaConfig"}[arch]
    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, initializer_range=0.2, tie_word_embeddings=False, max_position_embeddings=512)
    cfg = getattr(transformers, cls)(**kw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts(n: int, seed: int = 0, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 4 + int(torch.randint(0, 12, (1,), generator=g))
        base = torch.randint(3, vocab, (length,), generator=g).tolist()
        out.append(base + base[: length // 2] if i % 2 else base)  # some repetition
    return out


def write_checkpoint(folder: Path, target, *, kind: str = "dspark", markov_type: str = "vanilla", rank: int = 4,
                     layers: int = 2, block: int = 4, taps=(0, 2), confidence: bool = True, with_markov: bool = True,
                     nested: bool = False, own_embeddings: bool = False, draft_vocab: int | None = None,
                     drop: str | None = None, overrides: dict | None = None, seed: int = 1, scale: float = 0.3) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for a drafter of ``target`` (H = its hidden size).

    ``kind='dflash'``: no Markov / confidence head.  ``nested``: the DSpark keys under
    ``dflash_config`` (SpecForge).  ``drop``: leave that tensor out.  ``overrides``: config keys."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    t = target.config
    H, V = t.hidden_size, t.vocab_size
    nh, nkv, hd, inter = 4, 2, 8, 48
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * scale

    st: dict[str, torch.Tensor] = {}
    for i in range(layers):
        p = f"layers.{i}."
        st[p + "self_attn.q_proj.weight"] = w(nh * hd, H)
        st[p + "self_attn.k_proj.weight"] = w(nkv * hd, H)
        st[p + "self_attn.v_proj.weight"] = w(nkv * hd, H)
        st[p + "self_attn.o_proj.weight"] = w(H, nh * hd)
        st[p + "self_attn.q_norm.weight"] = 1 + w(hd)
        st[p + "self_attn.k_norm.weight"] = 1 + w(hd)
        st[p + "mlp.gate_proj.weight"] = w(inter, H)
        st[p + "mlp.up_proj.weight"] = w(inter, H)
        st[p + "mlp.down_proj.weight"] = w(H, inter)
        st[p + "input_layernorm.weight"] = 1 + w(H)
        st[p + "post_attention_layernorm.weight"] = 1 + w(H)
    st["fc.weight"] = w(H, len(taps) * H)
    st["hidden_norm.weight"] = 1 + w(H)
    st["norm.weight"] = 1 + w(H)
    dV = draft_vocab or V
    markov = kind == "dspark"
    if markov:
        st["markov_head.markov_w1.weight"] = w(V, rank) * 3
        st["markov_head.markov_w2.weight"] = w(dV, rank) * 3
        if markov_type == "gated":
            st["markov_head.gate_proj.weight"] = w(rank, H + rank)
            st["markov_head.gate_proj.bias"] = w(rank)
        elif markov_type == "rnn":
            st["markov_head.joint_proj.weight"] = w(3 * rank, 2 * rank + H)
            st["markov_head.joint_proj.bias"] = w(3 * rank)
        if confidence:
            st["confidence_head.proj.weight"] = w(1, H + (rank if with_markov else 0))
            st["confidence_head.proj.bias"] = w(1)
    if own_embeddings:
        st["embed_tokens.weight"] = w(V, H)
    if draft_vocab:
        st["lm_head.weight"] = w(dV, H)
        st["d2t"] = (torch.randperm(V - 3, generator=g)[:dV].sort().values + 3) - torch.arange(dV)
    if drop:
        del st[drop]
    save_file({k: v.contiguous() for k, v in st.items()}, str(folder / "model.safetensors"))
    cfg = json.loads(t.to_json_string())
    keys = {"block_size": block, "target_layer_ids": list(taps), "mask_token_id": 0}
    if markov:
        keys.update(markov_rank=rank, markov_head_type=markov_type, enable_confidence_head=confidence,
                    confidence_head_with_markov=confidence and with_markov)
    if draft_vocab:
        keys["draft_vocab_size"] = dV
    cfg.update(architectures=["Qwen3DSparkModel" if markov else "DFlashDraftModel"], num_hidden_layers=layers,
               num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd, intermediate_size=inter)
    if nested:
        cfg["dflash_config"] = keys
    else:
        cfg.update(keys)
    cfg.update(overrides or {})
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


class ToyTok:
    """The tokenizer a pipeline needs around the tiny targets (96 ids, 0-2 special)."""

    eos_token_id, pad_token_id, bos_token_id = 2, 0, 1
    all_special_ids = [0, 1, 2]

    def __len__(self):
        return 96

    def decode(self, ids, **_):
        return " ".join(map(str, ids))
