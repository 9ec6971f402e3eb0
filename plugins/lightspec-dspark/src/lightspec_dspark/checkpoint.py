"""Reading and writing DSpark / DFlash checkpoints in the public DeepSpec layout: a folder with
``config.json`` (see :mod:`lightspec_dspark.config`) and ``model.safetensors``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import CheckpointError, DSparkConfig, check_fits_target, read_config
from .model import OWN, DSparkDraft, SharedRows

WEIGHTS = "model.safetensors"
# tensors some exporters write that the drafter does not use (training-only or placeholders)
IGNORED = ("t2d", "mask_embedding")


def _strip(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = folder / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {WEIGHTS}")
    return {_strip(k): v for k, v in load_file(str(path)).items() if not any(k.endswith(i) or i + "." in k for i in IGNORED)}


def load_drafter(folder: str | Path, target, dtype: torch.dtype = torch.float32, device=None) -> DSparkDraft:
    """The drafter of checkpoint ``folder`` for ``target`` (an HF causal LM).  ``embed_tokens`` and
    ``lm_head`` come from the checkpoint when it has them, else from the target (shared).
    Raises :class:`CheckpointError` naming the field / tensor and both values when the
    checkpoint does not fit the target or lacks a tensor."""
    folder = Path(folder)
    cfg, _ = read_config(folder)
    state = read_weights(folder)
    own_embed, own_head = "embed_tokens.weight" in state, "lm_head.weight" in state
    if cfg.out_vocab < cfg.vocab_size and "d2t" not in state:
        raise CheckpointError(f"{folder}: draft_vocab_size={cfg.draft_vocab_size} < vocab_size={cfg.vocab_size} "
                              f"needs the tensor 'd2t', which the checkpoint lacks")
    check_fits_target(cfg, target.config, shares_embeddings=not own_embed)
    t_embed, t_head = target.get_input_embeddings(), target.get_output_embeddings()
    if not own_head and t_head is None:
        raise CheckpointError(f"{folder}: no lm_head in the checkpoint and the target has none to share")
    head = OWN if own_head else t_head
    if not own_head and cfg.out_vocab < cfg.vocab_size:  # a reduced vocabulary over the shared lm_head
        head = SharedRows(t_head, _draft_ids(folder, state["d2t"], cfg.out_vocab, t_head.weight.shape[0]))
    model = DSparkDraft(cfg, embed_tokens=OWN if own_embed else t_embed, lm_head=head)
    expected = model.state_dict()
    for key, ref in expected.items():
        if key not in state:
            raise CheckpointError(f"{folder}: missing tensor {key!r} (expected shape {list(ref.shape)} for this config)")
        if tuple(state[key].shape) != tuple(ref.shape):
            raise CheckpointError(f"{folder}: tensor {key!r} has shape {list(state[key].shape)}, "
                                  f"the config needs {list(ref.shape)}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise CheckpointError(f"{folder}: tensors this config does not use: {extra[:5]} (check markov_head_type, "
                              f"enable_confidence_head and confidence_head_with_markov)")
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    model.to(dtype=dtype)
    if model.d2t is not None:
        model.d2t = model.d2t.long()
    if device is not None:
        model.to(device)
    return model.eval()


def _draft_ids(folder: Path, d2t: torch.Tensor, size: int, vocab: int) -> torch.Tensor:
    """Target ids ``i + d2t[i]`` of the draft vocabulary, checked against the target's ``vocab``."""
    if tuple(d2t.shape) != (size,):
        raise CheckpointError(f"{folder}: tensor 'd2t' has shape {list(d2t.shape)}, the config needs [{size}]")
    ids = torch.arange(size) + d2t.long()
    if size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise CheckpointError(f"{folder}: 'd2t' maps draft ids to target ids {int(ids.min())}..{int(ids.max())}; "
                              f"the target's lm_head has {vocab} rows")
    return ids


def save_drafter(model: DSparkDraft, folder: str | Path, base_config: dict | None = None,
                 dtype: torch.dtype = torch.float16, extra: dict | None = None) -> Path:
    """Write ``model`` to ``folder`` (``config.json`` = ``base_config`` (the target's) + the drafter's
    keys + ``extra``; ``model.safetensors`` in ``dtype``; shared embeddings are not written)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous().cpu()
             for k, v in model.state_dict().items()}
    tmp = folder / (WEIGHTS + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / WEIGHTS)
    config = model.cfg.to_json(base_config)
    config.update(extra or {})
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


def target_config_dict(target) -> dict:
    """The target's config as a JSON-ready dict (the base of a DeepSpec config)."""
    cfg = target.config.to_dict()
    return json.loads(json.dumps(cfg, default=str))


def new_drafter(target, cfg: DSparkConfig, seed: int = 0) -> DSparkDraft:
    """A freshly initialised drafter sharing the target's embeddings and lm_head (fp32)."""
    check_fits_target(cfg, target.config, shares_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = DSparkDraft(cfg, embed_tokens=target.get_input_embeddings(), lm_head=target.get_output_embeddings())
        for name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)
    return model
