"""Reading and writing EAGLE-3 heads in the public checkpoint format, checked against a target.

A head folder holds ``config.json`` (any layout ``config.parse_config`` reads) and its
weights as ``model.safetensors`` (or a sharded ``model.safetensors.index.json``, or
``pytorch_model.bin``).  Tensor names accepted: the decoder layer under ``midlayer.`` (EAGLE,
SpecForge) or ``layers.0.`` (vLLM, SGLang, speculators), optionally behind a ``model.``
prefix; ``fc``, ``norm``, ``lm_head``, ``d2t`` / ``t2d`` (absent when the draft vocabulary
is the target's), ``embed_tokens`` (absent: the target's embeddings), ``input_norm``
(norm before fc).  LightSpec also reads a head without ``lm_head``: the target's output embedding is then
used, as the embeddings are (that is how the zoo keeps its head small) -- all of it when the
draft vocabulary is the target's, else its rows ``i + d2t[i]`` (a shared head restricted to
a reduced draft vocabulary, as ``lightspec eagle3 shrink-vocab`` writes it).

``load_head`` refuses a head that does not fit its target with one ``ConfigError`` naming
the field and both values.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lightspec_core import ConfigError, num_layers

from .config import HeadConfig, eagle_config_dict, read_config
from .modeling import Eagle3Head

WEIGHTS = "model.safetensors"


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single, index, legacy = folder / WEIGHTS, folder / "model.safetensors.index.json", folder / "pytorch_model.bin"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(str(folder / name)))
        return state
    if legacy.is_file():
        return torch.load(legacy, map_location="cpu", weights_only=True)
    raise ConfigError(f"{folder}: no weights (looked for {WEIGHTS}, model.safetensors.index.json, pytorch_model.bin)")


def tensor_names(folder: Path) -> list[str]:
    """The tensor names of the head in ``folder`` (any container ``_read_state`` reads), without
    loading the tensors where the container allows it."""
    from safetensors import safe_open

    folder = Path(folder)
    single, index, legacy = folder / WEIGHTS, folder / "model.safetensors.index.json", folder / "pytorch_model.bin"
    if single.is_file():
        with safe_open(str(single), "pt") as f:
            return list(f.keys())
    if index.is_file():
        return list(json.loads(index.read_text())["weight_map"])
    if legacy.is_file():
        try:
            return list(torch.load(legacy, map_location="cpu", weights_only=True, mmap=True))
        except RuntimeError:  # a pre-zipfile pickle cannot be mapped
            return list(torch.load(legacy, map_location="cpu", weights_only=True))
    return []


def normalize_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Public tensor names → this module's: ``model.`` prefixes dropped, ``midlayer.`` → ``layers.0.``."""
    out = {}
    for name, t in state.items():
        if name.startswith("model."):
            name = name[len("model."):]
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        out[name] = t
    return out


def _shape(t) -> list[int]:
    return list(t.shape)


def check_fit(cfg: HeadConfig, state: dict[str, torch.Tensor], target) -> None:
    """Raise ``ConfigError`` if the head does not fit ``target`` (an HF causal LM) or its
    tensors do not fit its own config: one message naming the field and both values."""
    t_embed = target.get_input_embeddings().weight
    t_head = target.get_output_embeddings()
    t_vocab = t_head.weight.shape[0] if t_head is not None else t_embed.shape[0]
    t_hidden = int(getattr(target.config, "hidden_size", t_embed.shape[1]))
    if cfg.target_hidden_size != t_hidden:
        raise ConfigError(f"EAGLE-3 head does not fit the target: target_hidden_size is {cfg.target_hidden_size} in the "
                          f"head, but the target's hidden_size is {t_hidden}")
    if cfg.vocab_size != t_vocab:
        raise ConfigError(f"EAGLE-3 head does not fit the target: vocab_size is {cfg.vocab_size} in the head, but the "
                          f"target's vocabulary has {t_vocab} tokens")
    L = num_layers(target)
    taps = cfg.taps(L)
    if cfg.aux_layer_ids is not None and not all(0 <= i <= L - 2 for i in cfg.aux_layer_ids):
        raise ConfigError(f"EAGLE-3 head does not fit the target: eagle_aux_hidden_state_layer_ids="
                          f"{cfg.aux_layer_ids} in the head, but the target has {L} layers (ids 0..{L - 2})")
    if not all(1 <= t <= L for t in taps):
        raise ConfigError(f"EAGLE-3 head does not fit the target: its default taps hidden_states[2, L//2, L-3] = "
                          f"{taps} need L >= 4 layers, but the target has {L}")
    if "embed_tokens.weight" not in state and t_embed.shape[1] != cfg.hidden_size:
        raise ConfigError(f"EAGLE-3 head does not fit the target: hidden_size is {cfg.hidden_size} in the head (which "
                          f"has no embed_tokens), but the target's embeddings are {t_embed.shape[1]} wide")
    if "lm_head.weight" not in state:
        if cfg.draft_vocab_size != cfg.vocab_size and "d2t" not in state:
            raise ConfigError(f"EAGLE-3 head is missing tensor lm_head.weight (needed: draft_vocab_size is "
                              f"{cfg.draft_vocab_size}, vocab_size is {cfg.vocab_size}, and there is no d2t "
                              "naming the target rows to share)")
        if t_head is None or list(t_head.weight.shape) != [cfg.vocab_size, cfg.hidden_size]:
            got = None if t_head is None else _shape(t_head.weight)
            raise ConfigError(f"EAGLE-3 head has no lm_head.weight and the target's output embedding cannot stand in: "
                              f"it is {got}, the head needs [{cfg.vocab_size}, {cfg.hidden_size}]")


def _check_tensors(head: Eagle3Head, state: dict[str, torch.Tensor]) -> None:
    want = head.state_dict()
    for name, t in want.items():
        if name not in state:
            if name in ("d2t", "t2d") and head.cfg.draft_vocab_size == head.cfg.vocab_size:
                continue
            raise ConfigError(f"EAGLE-3 head is missing tensor {name} (shape {_shape(t)})")
        if _shape(state[name]) != _shape(t):
            raise ConfigError(f"EAGLE-3 head tensor {name} has shape {_shape(state[name])}, but its config "
                              f"(hidden_size={head.cfg.hidden_size}, target_hidden_size={head.cfg.target_hidden_size}, "
                              f"draft_vocab_size={head.cfg.draft_vocab_size}) needs {_shape(t)}")
    extra = sorted(set(state) - set(want))
    if extra:
        raise ConfigError(f"EAGLE-3 head has tensors this loader does not know: {', '.join(extra[:5])}")
    if "d2t" in state:
        ids = torch.arange(head.cfg.draft_vocab_size) + state["d2t"].long()
        bad = ((ids < 0) | (ids >= head.cfg.vocab_size)).nonzero()
        if bad.numel():
            i = int(bad[0])
            raise ConfigError(f"EAGLE-3 head d2t maps draft id {i} to target id {int(ids[i])}, outside the vocabulary "
                              f"[0, {head.cfg.vocab_size})")


def load_head(folder, target, dtype: torch.dtype | None = None) -> Eagle3Head:
    """The head in ``folder``, checked against ``target`` and sharing its embeddings (and its
    lm_head when the head has none), on the target's device, in ``dtype`` (default: the
    target's embedding dtype), in eval mode."""
    folder = Path(folder)
    cfg = read_config(folder)
    state = normalize_names(_read_state(folder))
    if cfg.norm_before_fc is None:
        cfg.norm_before_fc = "input_norm.weight" in state
    if "d2t" in state and "t2d" not in state:  # vLLM reads d2t only; t2d follows from it
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        ids = torch.arange(state["d2t"].numel()) + state["d2t"].long()
        t2d[ids[(ids >= 0) & (ids < cfg.vocab_size)]] = True
        state["t2d"] = t2d
    check_fit(cfg, state, target)
    t_embed = target.get_input_embeddings().weight
    t_out = target.get_output_embeddings()
    dtype = dtype or t_embed.dtype
    head = Eagle3Head(cfg, own_embed="embed_tokens.weight" in state, own_lm_head="lm_head.weight" in state,
                      embed=t_embed, lm_head=None if t_out is None else t_out.weight)
    _check_tensors(head, state)
    if "d2t" in state:
        state["d2t"] = state["d2t"].long()
        state["t2d"] = state["t2d"].bool()
    else:
        state["d2t"], state["t2d"] = head.d2t, head.t2d
    head.load_state_dict(state, strict=True)
    return head.to(device=t_embed.device, dtype=dtype).eval()


def save_head(head: Eagle3Head, folder, dtype: torch.dtype = torch.float16, layer_prefix: str = "midlayer.") -> Path:
    """Write ``head`` in the EAGLE reference layout: ``config.json`` and ``model.safetensors``
    (float tensors in ``dtype``; ``d2t``/``t2d`` only with a reduced draft vocabulary; the
    target's shared embeddings never)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = head.cfg
    out = {}
    for name, t in head.state_dict().items():
        if name in ("d2t", "t2d"):
            if cfg.draft_vocab_size == cfg.vocab_size:
                continue
        elif t.is_floating_point():
            t = t.to(dtype)
        if name.startswith("layers.0."):
            name = layer_prefix + name[len("layers.0."):]
        out[name] = t.detach().cpu().contiguous()
    save_file(out, str(folder / WEIGHTS), metadata={"format": "pt"})
    raw = eagle_config_dict(cfg)
    if cfg.norm_before_fc:
        raw["norm_before_fc"] = True
    raw["torch_dtype"] = str(dtype).replace("torch.", "")
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return folder
