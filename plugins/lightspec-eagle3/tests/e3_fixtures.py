"""Tiny random targets and EAGLE-3 heads written in each public layout, plus an independent
functional reference of the head's forward (written from the EAGLE / vLLM / speculators
descriptions, not from this plugin's module) to check what a loaded head computes."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from lightspec_eagle3.checkpoint import save_head
from lightspec_eagle3.config import HeadConfig
from lightspec_eagle3.modeling import Eagle3Head
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 96
TARGET_H = 64
LAYERS = 6

LAYOUTS = ["eagle", "layers0_specforge", "embed_tokens", "target_hidden_size", "norm_before_fc",
           "norm_before_residual", "speculators", "full_vocab", "aux_ids", "vllm_arch"]


def tiny_target(seed: int = 0, vocab: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=TARGET_H, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def head_config(layout: str = "eagle", draft_vocab: int = 48) -> HeadConfig:
    H = 32 if layout == "target_hidden_size" else TARGET_H
    return HeadConfig(hidden_size=H, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, vocab_size=VOCAB, draft_vocab_size=VOCAB if layout == "full_vocab" else draft_vocab,
                      target_hidden_size=TARGET_H, rms_norm_eps=1e-5,
                      aux_layer_ids=[0, 2, 4] if layout in ("aux_ids", "speculators") else None,
                      norm_before_residual=layout in ("norm_before_residual", "speculators"),
                      norm_before_fc=layout == "norm_before_fc")


def random_head(target, layout: str = "eagle", seed: int = 1, scale: float = 0.3) -> Eagle3Head:
    """A head with random weights (norm weights around 1) for ``target``."""
    cfg = head_config(layout)
    own_embed = layout in ("embed_tokens", "target_hidden_size")
    head = Eagle3Head(cfg, own_embed=own_embed, own_lm_head=True, embed=target.get_input_embeddings().weight)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 * 4)
        if cfg.draft_vocab_size < cfg.vocab_size:
            ids = torch.sort(torch.randperm(cfg.vocab_size, generator=g)[: cfg.draft_vocab_size]).values
            head.d2t.copy_(ids - torch.arange(cfg.draft_vocab_size))
            head.t2d.zero_()
            head.t2d[ids] = True
    return head.eval()


def write_layout(folder: Path, head: Eagle3Head, layout: str) -> Path:
    """Save ``head`` as a checkpoint of ``layout`` would store it (fp32, to compare exactly)."""
    save_head(head, folder, dtype=torch.float32, layer_prefix="midlayer." if layout in ("eagle", "full_vocab") else "layers.0.")
    cfg_path = folder / "config.json"
    raw = json.loads(cfg_path.read_text())
    if layout == "layers0_specforge":
        raw["architectures"] = ["LlamaForCausalLMEagle3"]
    if layout == "vllm_arch":
        raw["architectures"] = ["Eagle3LlamaForCausalLM"]
        state = load_file(str(folder / "model.safetensors"))
        save_file({"model." + k if k.startswith("layers.") else k: v for k, v in state.items()},
                  str(folder / "model.safetensors"))
    if layout == "speculators":
        layer_keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                      "vocab_size", "rms_norm_eps", "hidden_act", "max_position_embeddings", "rope_theta",
                      "attention_bias", "mlp_bias", "model_type")
        raw = {
            "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
            "draft_vocab_size": raw["draft_vocab_size"], "target_hidden_size": None,
            "norm_before_residual": True, "norm_before_fc": False, "norm_output": False, "fc_norm": False,
            "eagle_aux_hidden_state_layer_ids": raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            "transformer_layer_config": {**{k: raw[k] for k in layer_keys}, "num_hidden_layers": 1},
        }
    if layout == "full_vocab":
        assert "draft_vocab_size" in raw
        del raw["draft_vocab_size"]  # draft_vocab_size absent: the whole vocabulary
    cfg_path.write_text(json.dumps(raw, indent=1))
    return folder


def _norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def reference_forward(folder: Path, target, taps: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of T committed pairs read straight from a checkpoint folder (any layout
    written by ``write_layout``): taps ``[T, 3·H_t]``, ids ``[T]`` (token t + 1 of each pair) →
    (layer outputs ``[T, H]``, logits over the TARGET vocabulary ``[T, V]``, -inf outside the
    draft vocabulary)."""
    raw = json.loads((folder / "config.json").read_text())
    lc = raw.get("transformer_layer_config", raw)
    w = {k.replace("model.", "", 1).replace("midlayer.", "layers.0."): v
         for k, v in load_file(str(folder / "model.safetensors")).items()}
    L = "layers.0."
    heads, kv, hd = lc["num_attention_heads"], lc["num_key_value_heads"], lc["head_dim"]
    x = taps
    if "input_norm.weight" in w:
        x = _norm(x, w["input_norm.weight"])
    g = x @ w["fc.weight"].T
    emb = w["embed_tokens.weight"][ids] if "embed_tokens.weight" in w else target.get_input_embeddings().weight[ids]
    normed = _norm(g, w[L + "hidden_norm.weight"])
    residual = normed if raw.get("norm_before_residual", False) else g
    a = torch.cat([_norm(emb, w[L + "input_layernorm.weight"]), normed], -1)
    T = ids.shape[0]
    q = (a @ w[L + "self_attn.q_proj.weight"].T).view(T, heads, hd).transpose(0, 1)
    k = (a @ w[L + "self_attn.k_proj.weight"].T).view(T, kv, hd).transpose(0, 1)
    v = (a @ w[L + "self_attn.v_proj.weight"].T).view(T, kv, hd).transpose(0, 1)
    pos = torch.arange(T)
    q, k = _rope(q, pos), _rope(k, pos)
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    s = (q @ k.transpose(-1, -2)) / hd ** 0.5
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    att = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, -1)
    h = residual + att @ w[L + "self_attn.o_proj.weight"].T
    m = _norm(h, w[L + "post_attention_layernorm.weight"])
    h = h + (torch.nn.functional.silu(m @ w[L + "mlp.gate_proj.weight"].T) * (m @ w[L + "mlp.up_proj.weight"].T)) \
        @ w[L + "mlp.down_proj.weight"].T
    logits_d = _norm(h, w["norm.weight"]) @ w["lm_head.weight"].T
    V = target.config.vocab_size
    out = torch.full((T, V), float("-inf"))
    tid = torch.arange(logits_d.shape[-1]) + (w["d2t"] if "d2t" in w else 0)
    out[:, tid] = logits_d
    return h, out
