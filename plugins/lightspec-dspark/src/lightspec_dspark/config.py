"""The DSpark / DFlash checkpoint configuration (the public DeepSpec format).

A checkpoint's ``config.json`` is the target's config plus the drafter's keys, either flat
(DeepSpec) or nested under ``dflash_config`` (SpecForge); both are read, the nested value
winning.  :func:`read_config` turns it into a :class:`DSparkConfig` and refuses values that
are not allowed with one error naming the field.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lightspec_core import InvalidValueError

ARCHITECTURE = "Qwen3DSparkModel"
MARKOV_TYPES = ("vanilla", "gated", "rnn")
# keys that may sit under ``dflash_config`` (SpecForge) as well as at the top level
NESTED_KEYS = ("block_size", "target_layer_ids", "mask_token_id", "markov_rank", "markov_head_type",
               "enable_confidence_head", "confidence_head_with_markov", "draft_vocab_size", "target_hidden_size")


class CheckpointError(InvalidValueError):
    """A DSpark checkpoint that cannot be read, or that does not fit its target."""


@dataclass
class DSparkConfig:
    """What the drafter's modules need.  Shapes: H = ``hidden_size``, L = ``len(target_layer_ids)``,
    ``fc [H, L * target_hidden_size]``, ``markov_w1 [vocab_size, markov_rank]``,
    ``markov_w2 [draft_vocab_size, markov_rank]``."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    markov_rank: int = 0
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    architectures: list[str] = field(default_factory=lambda: [ARCHITECTURE])

    @property
    def kind(self) -> str:
        """``dspark`` (a Markov head) or ``dflash`` (none)."""
        return "dspark" if self.markov_rank > 0 else "dflash"

    @property
    def out_vocab(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    @property
    def feature_size(self) -> int:
        return self.target_hidden_size or self.hidden_size

    def to_json(self, base: dict | None = None) -> dict:
        """The flat DeepSpec config: ``base`` (the target's config) overlaid with the drafter's keys."""
        out = dict(base or {})
        for key in ("rope_scaling",):
            out.pop(key, None)
        out.update({k: v for k, v in asdict(self).items() if v is not None})
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        out.pop("dflash_config", None)
        return out


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    if kind not in ("default", None):
        raise CheckpointError(f"rope_parameters.rope_type={kind!r} is not supported: this drafter implements "
                              "the default RoPE only")
    theta = (params.get("rope_theta") if isinstance(params, dict) else None) or cfg.get("rope_theta")
    return float(theta if theta is not None else 1_000_000.0)


def _bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    raise CheckpointError(f"{name}={value!r} is invalid: use true or false")


def _int(name: str, value, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise CheckpointError(f"{name}={value!r} is invalid: use an integer >= {low}")
    return value


def parse_config(raw: dict) -> DSparkConfig:
    """A :class:`DSparkConfig` from a ``config.json`` dict (flat or SpecForge-nested)."""
    cfg = dict(raw)
    nested = cfg.get("dflash_config") or {}
    if not isinstance(nested, dict):
        raise CheckpointError(f"dflash_config={nested!r} is invalid: use a mapping")
    for key in NESTED_KEYS:
        if key in nested:
            cfg[key] = nested[key]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "block_size",
                "target_layer_ids", "mask_token_id"):
        if key not in cfg:
            raise CheckpointError(f"config.json has no {key!r} (a DSpark/DFlash config needs it)")
    H = _int("hidden_size", cfg["hidden_size"], 1)
    heads = _int("num_attention_heads", cfg["num_attention_heads"], 1)
    layers = cfg["target_layer_ids"]
    if not isinstance(layers, list) or not layers or not all(isinstance(i, int) for i in layers):
        raise CheckpointError(f"target_layer_ids={layers!r} is invalid: use a non-empty list of layer ids")
    markov_type = str(cfg.get("markov_head_type") or "vanilla").lower()
    if markov_type not in MARKOV_TYPES:
        raise CheckpointError(f"markov_head_type={cfg.get('markov_head_type')!r} is invalid: use one of {MARKOV_TYPES}")
    layer_types = cfg.get("layer_types") or []
    if any(t == "sliding_attention" for t in layer_types) or (nested.get("use_swa")):
        raise CheckpointError("layer_types with 'sliding_attention' (or dflash_config.use_swa) is not supported: "
                              "this drafter implements full attention only")
    out = DSparkConfig(
        hidden_size=H,
        intermediate_size=_int("intermediate_size", cfg.get("intermediate_size", 4 * H), 1),
        num_hidden_layers=_int("num_hidden_layers", cfg["num_hidden_layers"], 1),
        num_attention_heads=heads,
        num_key_value_heads=_int("num_key_value_heads", cfg.get("num_key_value_heads") or heads, 1),
        head_dim=_int("head_dim", cfg.get("head_dim") or H // heads, 1),
        vocab_size=_int("vocab_size", cfg["vocab_size"], 1),
        block_size=_int("block_size", cfg["block_size"], 1),
        target_layer_ids=list(layers),
        mask_token_id=_int("mask_token_id", cfg["mask_token_id"], 0),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        attention_bias=_bool("attention_bias", cfg.get("attention_bias", False)),
        markov_rank=_int("markov_rank", cfg.get("markov_rank", 0) or 0, 0),
        markov_head_type=markov_type,
        enable_confidence_head=_bool("enable_confidence_head", cfg.get("enable_confidence_head", False)),
        confidence_head_with_markov=_bool("confidence_head_with_markov", cfg.get("confidence_head_with_markov", False)),
        draft_vocab_size=cfg.get("draft_vocab_size"),
        target_hidden_size=cfg.get("target_hidden_size"),
        architectures=list(cfg.get("architectures") or [ARCHITECTURE]),
    )
    if out.num_attention_heads % out.num_key_value_heads:
        raise CheckpointError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads="
                              f"{out.num_key_value_heads}")
    if out.mask_token_id >= out.vocab_size:
        raise CheckpointError(f"mask_token_id={out.mask_token_id} is outside the vocabulary [0, {out.vocab_size})")
    if out.confidence_head_with_markov and out.enable_confidence_head and out.markov_rank == 0:
        raise CheckpointError("confidence_head_with_markov=true needs a Markov head (markov_rank > 0)")
    if out.draft_vocab_size is not None:
        _int("draft_vocab_size", out.draft_vocab_size, 1)
    return out


def read_config(folder: str | Path) -> tuple[DSparkConfig, dict]:
    """``(config, raw dict)`` of the checkpoint folder's ``config.json``."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json (a DSpark checkpoint folder holds config.json and "
                              "model.safetensors)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    return parse_config(raw), raw


def check_fits_target(cfg: DSparkConfig, target_config, shares_embeddings: bool) -> None:
    """Refuse a drafter whose config does not fit the target: one error naming the field and both values."""
    t_hidden = getattr(target_config, "hidden_size", None)
    t_vocab = getattr(target_config, "vocab_size", None)
    t_layers = getattr(target_config, "num_hidden_layers", None)
    if cfg.feature_size != t_hidden:
        name = "target_hidden_size" if cfg.target_hidden_size else "hidden_size"
        raise CheckpointError(f"{name} does not fit the target: checkpoint {cfg.feature_size}, target {t_hidden}")
    if shares_embeddings and cfg.hidden_size != t_hidden:
        raise CheckpointError(f"hidden_size does not fit the target's shared embeddings: checkpoint "
                              f"{cfg.hidden_size}, target {t_hidden}")
    if cfg.vocab_size != t_vocab:
        raise CheckpointError(f"vocab_size does not fit the target: checkpoint {cfg.vocab_size}, target {t_vocab}")
    bad = [i for i in cfg.target_layer_ids if not -1 <= i < t_layers]
    if bad:
        raise CheckpointError(f"target_layer_ids does not fit the target: checkpoint {cfg.target_layer_ids} "
                              f"(bad: {bad}), target has {t_layers} layers (ids -1 .. {t_layers - 1})")
    if sorted(set(cfg.target_layer_ids)) != cfg.target_layer_ids:
        raise CheckpointError(f"target_layer_ids={cfg.target_layer_ids} must be strictly increasing")
