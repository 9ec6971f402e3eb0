"""Reading and writing the public checkpoint layouts, and checking that a head fits its target.

MTP modules (kind a), in a folder whose ``config.json`` has ``num_nextn_predict_layers: n``
(the target's own checkpoint, or a module folder written by ``lightspec mtplayer train``,
which holds the target's config plus only the module tensors):

* DeepSeek-V3 / GLM layout: ``model.layers.{L+i}.{enorm, hnorm, eh_proj, shared_head.norm,
  shared_head.head, <decoder block>}`` with ``L = num_hidden_layers``; ``shared_head.head``
  may be absent (the target's lm_head is used) and ``embed_tokens`` is ignored (shared);
* MiMo layout: ``model.mtp_layers.{i}.{token_layernorm, hidden_layernorm, input_proj,
  final_layernorm, <decoder block>}``; ``input_proj`` reads ``[h; e]`` (DeepSeek reads
  ``[e; h]``), so its two column halves are swapped on load.

Weights come from ``model.safetensors`` or the shards named by ``model.safetensors.index.json``
(transformers drops these tensors when it loads the target, so they are read here).

Medusa heads (kind b): ``config.json`` with ``medusa_num_heads`` / ``medusa_num_layers`` (or
vLLM's ``num_heads`` / ``num_hidden_layers``), weights either in FasterDecoding's legacy
``medusa_lm_head.pt`` or ``medusa_lm_head.safetensors`` (as its training script and TGI save
them; ``{i}.{j}.linear.weight/bias`` for block j of head i, ``{i}.{L}.weight`` the head) or vLLM's naming in safetensors (``blocks.{i}.layers.{j}.weight/bias``,
``lm_heads.{i}.weight``).  LightSpec's extension: ``"lightspec_shared_lm_head": true`` says the
heads have no ``[V, H]`` matrix of their own and use the target's lm_head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lightspec_core import LightSpecError

from .modules import MedusaHeads, MTPLayer

SHARED_HEAD_KEY = "lightspec_shared_lm_head"


class HeadFitError(LightSpecError, ValueError):
    """A head that does not fit its target, or a checkpoint that lacks a tensor."""


def read_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise HeadFitError(f"{folder}: no config.json (a head folder needs one)") from None
    except ValueError as exc:
        raise HeadFitError(f"{path}: not valid JSON ({exc})") from None


def read_tensors(folder: Path, wanted) -> dict[str, torch.Tensor]:
    """The tensors of ``folder``'s safetensors (single file or sharded index) whose names
    satisfy ``wanted(name)``; only the shards that hold them are opened."""
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            if wanted(name):
                files.setdefault(shard, []).append(name)
    elif (folder / "model.safetensors").is_file():
        files = {"model.safetensors": None}
    else:
        raise HeadFitError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    out = {}
    for shard, names in files.items():
        with safe_open(str(folder / shard), framework="pt") as f:
            for name in names if names is not None else [n for n in f.keys() if wanted(n)]:
                out[name] = f.get_tensor(name)
    return out


def _fit(field: str, head_value, target_value, where: str) -> None:
    if head_value != target_value:
        raise HeadFitError(f"{where}: {field} is {head_value} in the head but {target_value} in the target; "
                           f"the head was made for another model")


def _assign(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str, optional=()) -> None:
    """Copy ``tensors`` into ``module``'s state dict by name: every name the module has must
    be there (except ``optional`` ones) with the module's shape; extra names are refused."""
    state = module.state_dict()
    missing = [n for n in state if n not in tensors and n not in optional]
    if missing:
        raise HeadFitError(f"{where}: missing tensor {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = [n for n in tensors if n not in state]
    if extra:
        raise HeadFitError(f"{where}: unexpected tensor {extra[0]!r} (the target's decoder block has no such weight)")
    for name, value in tensors.items():
        if tuple(value.shape) != tuple(state[name].shape):
            raise HeadFitError(f"{where}: tensor {name!r} has shape {list(value.shape)} but the target's "
                               f"architecture needs {list(state[name].shape)}")
    module.load_state_dict(tensors, strict=False)


# -- MTP modules ------------------------------------------------------------------------------


def mtp_layer_count(config: dict) -> int:
    n = config.get("num_nextn_predict_layers", 0) or 0
    if not isinstance(n, int) or n < 0:
        raise HeadFitError(f"num_nextn_predict_layers={n!r} is invalid: use an integer >= 0")
    return n


def _mtp_layout(folder: Path, L: int, n: int) -> tuple[str, dict[str, dict[str, torch.Tensor]]]:
    """('deepseek' | 'mimo', {layer i: {name inside the module: tensor}})."""
    deep = [f"model.layers.{L + i}." for i in range(n)]
    mimo = [f"model.mtp_layers.{i}." for i in range(n)]
    tensors = read_tensors(folder, lambda name: name.startswith(tuple(deep + mimo)))
    layout = "mimo" if any(k.startswith("model.mtp_layers.") for k in tensors) else "deepseek"
    prefixes = mimo if layout == "mimo" else deep
    per_layer = []
    for p in prefixes:
        per_layer.append({k[len(p):]: v for k, v in tensors.items() if k.startswith(p)})
    return layout, dict(enumerate(per_layer))


_MIMO_NAMES = {"token_layernorm.": "enorm.", "hidden_layernorm.": "hnorm.", "input_proj.": "eh_proj.",
               "final_layernorm.": "shared_head.norm."}
_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")


def _module_names(layout: str, raw: dict[str, torch.Tensor], H: int) -> dict[str, torch.Tensor]:
    """A checkpoint's names inside one module -> ``MTPLayer`` state-dict names."""
    out = {}
    for name, value in raw.items():
        if name.startswith("embed_tokens."):
            continue  # DeepSeek-V3 stores a copy of the shared embedding
        if layout == "mimo":
            for old, new in _MIMO_NAMES.items():
                if name.startswith(old):
                    name = new + name[len(old):]
                    if new == "eh_proj." and value.dim() == 2 and value.shape[1] == 2 * H:
                        value = torch.cat([value[:, H:], value[:, :H]], dim=1)  # [h; e] -> [e; h]
                    break
        out[name if name.startswith(_OWN) else "block." + name] = value
    return out


def load_mtp_layers(target: torch.nn.Module, folder: Path) -> list[MTPLayer]:
    """The MTP modules of ``folder`` (module docstring), built for ``target`` and checked
    against it, in the target's dtype and device, in eval mode."""
    folder = Path(folder)
    cfg = read_config(folder)
    n = mtp_layer_count(cfg)
    where = str(folder)
    if n == 0:
        raise HeadFitError(f"{where}: config.json has no num_nextn_predict_layers (no MTP modules to load)")
    tc = target.config
    for field in ("hidden_size", "vocab_size", "num_hidden_layers"):
        if field in cfg:
            _fit(field, cfg[field], getattr(tc, field), where)
    L = tc.num_hidden_layers
    layout, raw = _mtp_layout(folder, L, n)
    param = next(target.parameters())
    layers = []
    for i in range(n):
        if not raw[i]:
            raise HeadFitError(f"{where}: num_nextn_predict_layers is {n} but the checkpoint has no tensors of MTP "
                               f"layer {i} (model.layers.{L + i}.* or model.mtp_layers.{i}.*)")
        names = _module_names(layout, raw[i], tc.hidden_size)
        own = "shared_head.head.weight" in names
        layer = MTPLayer(target, L + i, own_head=own)
        _assign(layer, names, f"{where} MTP layer {i}")
        layers.append(layer.to(device=param.device, dtype=param.dtype).eval())
    return layers


def save_mtp_layers(layers: list[MTPLayer], target_config, folder: Path, dtype=torch.float16, extra: dict | None = None) -> Path:
    """Write ``layers`` as a module folder: the target's config plus ``num_nextn_predict_layers``
    and the tensors at ``model.layers.{L+i}.*`` (DeepSeek naming), loadable by ``load_mtp_layers``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = target_config.to_dict()
    cfg["num_nextn_predict_layers"] = len(layers)
    cfg.update(extra or {})
    L = target_config.num_hidden_layers
    tensors = {}
    for i, layer in enumerate(layers):
        for name, value in layer.state_dict().items():
            local = name[len("block."):] if name.startswith("block.") else name
            tensors[f"model.layers.{L + i}.{local}"] = value.detach().to("cpu", dtype).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return folder


# -- Medusa heads -----------------------------------------------------------------------------


def is_medusa(config: dict) -> bool:
    return "medusa_num_heads" in config or config.get("model_type") == "medusa"


def _medusa_tensors(folder: Path) -> dict[str, torch.Tensor]:
    legacy, legacy_st = folder / "medusa_lm_head.pt", folder / "medusa_lm_head.safetensors"
    if legacy.is_file():
        state = torch.load(str(legacy), map_location="cpu", weights_only=True)
    elif legacy_st.is_file():
        from safetensors.torch import load_file

        state = load_file(str(legacy_st))
    elif (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        state = read_tensors(folder, lambda name: True)
    elif (folder / "pytorch_model.bin").is_file():
        state = torch.load(str(folder / "pytorch_model.bin"), map_location="cpu", weights_only=True)
    else:
        raise HeadFitError(f"{folder}: no medusa_lm_head.pt, medusa_lm_head.safetensors, model.safetensors or "
                           "pytorch_model.bin")
    out = {}
    for name, value in state.items():
        for prefix in ("medusa_head.", "medusa_heads."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        out[name] = value
    return out


def _medusa_names(raw: dict[str, torch.Tensor], K: int, layers: int) -> dict[str, torch.Tensor]:
    """Legacy (``{i}.{j}.linear.*``, ``{i}.{L}.weight``) or vLLM (``blocks.{i}.layers.{j}.*``,
    ``lm_heads.{i}.weight``) names -> ``MedusaHeads`` state-dict names."""
    out = {}
    for name, value in raw.items():
        parts = name.split(".")
        if parts[0] == "blocks" and len(parts) == 5 and parts[2] == "layers":
            out[f"heads.{parts[1]}.{parts[3]}.linear.{parts[4]}"] = value
        elif parts[0] == "lm_heads" and len(parts) == 3:
            out[f"lm_heads.{parts[1]}.{parts[2]}"] = value
        elif parts[0].isdigit() and len(parts) == 4 and parts[2] == "linear":
            out[f"heads.{parts[0]}.{parts[1]}.linear.{parts[3]}"] = value
        elif parts[0].isdigit() and len(parts) == 3 and parts[1] == str(layers):
            out[f"lm_heads.{parts[0]}.{parts[2]}"] = value
        elif name == "token_map":
            raise HeadFitError("Medusa heads with a truncated vocabulary (token_map) are not supported: "
                               "use heads over the full vocabulary")
        else:
            out[name] = value  # refused by _assign with its name
    return out


def load_medusa(target: torch.nn.Module, folder: Path) -> MedusaHeads:
    """The Medusa heads of ``folder`` (module docstring), checked against ``target``."""
    folder = Path(folder)
    cfg = read_config(folder)
    where = str(folder)
    K = cfg.get("medusa_num_heads", cfg.get("num_heads"))
    layers = cfg.get("medusa_num_layers", cfg.get("num_hidden_layers", 1))
    for field, value in (("medusa_num_heads", K), ("medusa_num_layers", layers)):
        if not (isinstance(value, int) and value >= 1):
            raise HeadFitError(f"{where}: {field}={value!r} is invalid: use an integer >= 1")
    tc = target.config
    raw = _medusa_names(_medusa_tensors(folder), K, layers)
    H = next((v.shape[1] for k, v in raw.items() if k.endswith("linear.weight")), None)
    if H is not None:
        _fit("hidden_size", H, tc.hidden_size, where)
    for field in ("hidden_size", "vocab_size"):
        if field in cfg and cfg.get("model_type") == "medusa":
            _fit(field, cfg[field], getattr(tc, field), where)
    head_w = next((v for k, v in raw.items() if k.startswith("lm_heads.")), None)
    if head_w is not None:
        _fit("vocab_size", head_w.shape[0], tc.vocab_size, where)
    shared = bool(cfg.get(SHARED_HEAD_KEY, False))
    bias = any(k.endswith("linear.bias") for k in raw)
    heads = MedusaHeads(target, K, layers, own_heads=not shared, bias=bias)
    _assign(heads, raw, where)
    param = next(target.parameters())
    return heads.to(device=param.device, dtype=param.dtype).eval()


def save_medusa(heads: MedusaHeads, target_config, folder: Path, dtype=torch.float16, extra: dict | None = None,
                legacy: bool = False) -> Path:
    """Write ``heads``: vLLM naming in ``model.safetensors`` (default) or FasterDecoding's
    ``medusa_lm_head.pt`` (``legacy``), with a config both readers accept."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    K, layers = heads.num_heads, heads.num_layers
    tensors = {}
    for i in range(K):
        for j in range(layers):
            lin = heads.heads[i][j].linear
            for p in ("weight", "bias"):
                value = getattr(lin, p)
                if value is not None:
                    key = f"{i}.{j}.linear.{p}" if legacy else f"blocks.{i}.layers.{j}.{p}"
                    tensors[key] = value.detach().to("cpu", dtype).contiguous()
        if heads.own_heads:
            key = f"{i}.{layers}.weight" if legacy else f"lm_heads.{i}.weight"
            tensors[key] = heads.lm_heads[i].weight.detach().to("cpu", dtype).contiguous()
    if legacy:
        torch.save(tensors, str(folder / "medusa_lm_head.pt"))
    else:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["MedusaModel"], "model_type": "medusa", "medusa_num_heads": K, "medusa_num_layers": layers,
           "num_heads": K, "num_hidden_layers": layers, "hidden_size": target_config.hidden_size,
           "vocab_size": target_config.vocab_size, "medusa_fc_bias": heads.bias, SHARED_HEAD_KEY: not heads.own_heads,
           "base_model_name_or_path": getattr(target_config, "_name_or_path", "") or ""}
    cfg.update(extra or {})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return folder


def load_head(target: torch.nn.Module, folder: Path) -> tuple[str, object]:
    """``('mtp', [MTPLayer])`` or ``('medusa', MedusaHeads)`` from a head folder (or the
    target's own checkpoint when it has MTP modules)."""
    cfg = read_config(Path(folder))
    if is_medusa(cfg):
        return "medusa", load_medusa(target, folder)
    if mtp_layer_count(cfg):
        return "mtp", load_mtp_layers(target, folder)
    raise HeadFitError(f"{folder}: neither MTP modules (num_nextn_predict_layers in config.json) nor Medusa heads "
                       f"(medusa_num_heads)")
