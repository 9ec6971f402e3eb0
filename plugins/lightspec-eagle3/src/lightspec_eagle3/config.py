"""An EAGLE-3 head's ``config.json``, read from every public layout into one ``HeadConfig``.

Layouts (each seen in published checkpoints):

* EAGLE reference code / SpecForge / vLLM / SGLang: a flat ``LlamaForCausalLM``-style config
  (``architectures`` ``LlamaForCausalLM``, ``LlamaForCausalLMEagle3`` or
  ``Eagle3LlamaForCausalLM``), ``num_hidden_layers: 1``, ``draft_vocab_size``, optional
  ``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``;
* speculators (``Eagle3DraftModel`` / ``Eagle3Speculator``, ``speculators_model_type: eagle3``):
  the decoder layer's settings nested under ``transformer_layer_config``, the EAGLE-3 ones
  (``draft_vocab_size``, ``target_hidden_size``, ``norm_before_residual``, ``norm_before_fc``,
  ``norm_output``, ``eagle_aux_hidden_state_layer_ids``) at the top.

Tap convention: a configured layer id ``i`` is the *output of target block i*, i.e. HF
``hidden_states[i + 1]`` (SGLang captures "before layer i + 1"; SpecForge reads
``hidden_states[i + 1]``).  Without ids the taps are ``hidden_states[2], [L // 2], [L - 3]``
(the inputs of blocks 2, L // 2 and L - 3, as the EAGLE reference code captures them).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lightspec_core import ConfigError

FLAT_ARCHITECTURES = ("LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURES = ("Eagle3DraftModel", "Eagle3Speculator")


@dataclass
class HeadConfig:
    """Everything the head's modules and the loader need, whatever the layout.

    ``aux_layer_ids`` are the configured ids (output of block i = ``hidden_states[i + 1]``),
    or None for the default taps; ``taps(L)`` turns them into ``hidden_states`` indices."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 2048
    rope: dict = field(default_factory=lambda: {"rope_theta": 10000.0, "rope_type": "default"})
    aux_layer_ids: list[int] | None = None
    norm_before_residual: bool = False
    norm_before_fc: bool | None = None  # None: decided by the presence of input_norm.weight
    norm_output: bool = False
    layout: str = "eagle"  # "eagle" (flat) or "speculators"
    architecture: str = "LlamaForCausalLM"

    @property
    def n_taps(self) -> int:
        return 3 if self.aux_layer_ids is None else len(self.aux_layer_ids)

    def taps(self, target_layers: int) -> list[int]:
        """The ``hidden_states`` indices (HF numbering, 0 = embeddings) the head reads."""
        if self.aux_layer_ids is None:
            L = target_layers
            return [2, L // 2, L - 3]
        return [i + 1 for i in self.aux_layer_ids]

    def to_dict(self) -> dict:
        return asdict(self)


def _need(cfg: dict, key: str, where: str):
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"EAGLE-3 head config ({where}) has no {key!r}")
    return cfg[key]


def _int(cfg: dict, key: str, where: str, default=None) -> int:
    value = cfg.get(key, default) if default is not None else _need(cfg, key, where)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"EAGLE-3 head config ({where}): {key}={value!r} is invalid: use a positive integer")
    return value


def _flag(cfg: dict, key: str, default):
    value = cfg.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"EAGLE-3 head config: {key}={value!r} is invalid: use true or false")
    return value


def _rope(cfg: dict) -> dict:
    """The RoPE settings in transformers 5's ``rope_parameters`` form (legacy ``rope_theta`` /
    ``rope_scaling`` keys are folded in)."""
    if isinstance(cfg.get("rope_parameters"), dict):
        rope = dict(cfg["rope_parameters"])
    else:
        rope = dict(cfg.get("rope_scaling") or {})
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
    rope.setdefault("rope_theta", float(cfg.get("rope_theta", 10000.0)))
    rope.setdefault("rope_type", "default")
    return rope


def parse_config(raw: dict, where: str = "config.json") -> HeadConfig:
    """A ``HeadConfig`` from a head's config dict in any supported layout (module docstring).
    Raises ``ConfigError`` naming the field for anything outside them."""
    if not isinstance(raw, dict):
        raise ConfigError(f"EAGLE-3 head config ({where}) is not a JSON object")
    archs = raw.get("architectures") or []
    speculators = "transformer_layer_config" in raw or raw.get("speculators_model_type") == "eagle3" or any(
        a in SPECULATORS_ARCHITECTURES for a in archs)
    if speculators:
        base = raw.get("transformer_layer_config")
        if not isinstance(base, dict):
            raise ConfigError(f"EAGLE-3 head config ({where}): the speculators layout needs a "
                              f"'transformer_layer_config' object, got {base!r}")
        if raw.get("speculators_model_type", "eagle3") != "eagle3":
            raise ConfigError(f"EAGLE-3 head config ({where}): speculators_model_type="
                              f"{raw['speculators_model_type']!r} is not supported: only 'eagle3'")
        top = raw
        arch = next((a for a in archs if a in SPECULATORS_ARCHITECTURES), "Eagle3DraftModel")
        residual_default = True  # speculators' (and vLLM's reading of it) default
    else:
        base = top = raw
        bad = [a for a in archs if a not in FLAT_ARCHITECTURES]
        if bad or not archs:
            allowed = ", ".join(FLAT_ARCHITECTURES + SPECULATORS_ARCHITECTURES)
            raise ConfigError(f"EAGLE-3 head config ({where}): architectures={archs!r} is not an EAGLE-3 head: "
                              f"use one of {allowed}")
        arch = archs[0]
        residual_default = False
    layers = base.get("num_hidden_layers", 1)
    if layers != 1:
        raise ConfigError(f"EAGLE-3 head config ({where}): num_hidden_layers={layers!r} is not supported: "
                          "an EAGLE-3 head has exactly 1 decoder layer")
    if top.get("fc_norm"):
        raise ConfigError(f"EAGLE-3 head config ({where}): fc_norm=true (a norm per tapped layer) is not supported: "
                          "use norm_before_fc or no norm")
    H = _int(base, "hidden_size", where)
    heads = _int(base, "num_attention_heads", where)
    vocab = _int(base, "vocab_size", where)
    draft_vocab = top.get("draft_vocab_size") or vocab
    if not isinstance(draft_vocab, int) or not 0 < draft_vocab <= vocab:
        raise ConfigError(f"EAGLE-3 head config ({where}): draft_vocab_size={draft_vocab!r} is invalid: "
                          f"use an integer in [1, vocab_size={vocab}]")
    target_hidden = top.get("target_hidden_size") or H
    eagle_cfg = top.get("eagle_config") if isinstance(top.get("eagle_config"), dict) else {}
    ids = top.get("eagle_aux_hidden_state_layer_ids", eagle_cfg.get("eagle_aux_hidden_state_layer_ids"))
    if ids is not None and (not isinstance(ids, list) or not ids
                            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ConfigError(f"EAGLE-3 head config ({where}): eagle_aux_hidden_state_layer_ids={ids!r} is invalid: "
                          "use a non-empty list of target layer ids")
    act = base.get("hidden_act", "silu")
    return HeadConfig(
        hidden_size=H,
        intermediate_size=_int(base, "intermediate_size", where),
        num_attention_heads=heads,
        num_key_value_heads=_int(base, "num_key_value_heads", where, default=heads),
        head_dim=_int(base, "head_dim", where, default=H // heads),
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=_int({"target_hidden_size": target_hidden}, "target_hidden_size", where),
        rms_norm_eps=float(base.get("rms_norm_eps", 1e-6)),
        hidden_act=act,
        attention_bias=bool(base.get("attention_bias", False)),
        mlp_bias=bool(base.get("mlp_bias", False)),
        max_position_embeddings=int(base.get("max_position_embeddings", 2048)),
        rope=_rope(base),
        aux_layer_ids=list(ids) if ids is not None else None,
        norm_before_residual=_flag(top, "norm_before_residual", residual_default),
        norm_before_fc=_flag(top, "norm_before_fc", None),
        norm_output=_flag(top, "norm_output", False),
        layout="speculators" if speculators else "eagle",
        architecture=arch,
    )


def read_config(folder: Path) -> HeadConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder} is not an EAGLE-3 head folder: no config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    return parse_config(raw, str(path))


def eagle_config_dict(cfg: HeadConfig) -> dict:
    """The config.json LightSpec writes: the EAGLE reference layout (flat Llama config,
    ``LlamaForCausalLM``, one layer), readable by vLLM, SGLang and SpecForge too."""
    out = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": cfg.hidden_act,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope.get("rope_theta", 10000.0),
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
    if cfg.rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in cfg.rope.items() if k != "rope_theta"}
    if cfg.aux_layer_ids is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)}
    if cfg.norm_before_residual:
        out["norm_before_residual"] = True
    return out
