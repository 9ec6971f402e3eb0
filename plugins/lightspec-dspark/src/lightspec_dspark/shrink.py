"""Restricting a trained drafter to a reduced draft vocabulary (``lightspec dspark shrink-vocab``).

A DSpark block's last matmul is ``lm_head [draft_vocab, H]`` over every slot of the block; for
the zoo drafter, which borrows the target's 8,192-row ``lm_head``, it is the largest part of a
propose.  A drafter trained on the whole vocabulary can be restricted afterwards without
retraining: its logits over the kept tokens (``lm_head`` rows and the Markov head's
``markov_w2`` rows) are exactly the ones it had, so a draft changes only where the
whole-vocabulary argmax lay outside the kept set.

The result is the public layout with ``draft_vocab_size`` and ``d2t`` (target id = i +
``d2t[i]``).  An ``lm_head`` of the drafter's own is sliced; a shared one stays shared and the
loader gathers the target's rows ``i + d2t[i]`` once (a LightSpec reading of the layout: the
public checkpoints with a reduced vocabulary carry their own ``lm_head``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from lightspec_core import InvalidValueError

from .checkpoint import load_drafter, save_drafter
from .model import OWN, DSparkDraft, SharedRows


def frequent_tokens(tokens: np.ndarray, vocab: int, size: int, allowed: np.ndarray | None = None) -> np.ndarray:
    """The ``size`` most frequent ids of ``tokens`` below ``vocab`` (ties: lower id first), only
    among ``allowed`` when given (``size`` must not exceed it), ascending, so that
    ``d2t[i] = ids[i] - i`` is non-negative as in the public checkpoints."""
    counts = np.bincount(tokens[(tokens >= 0) & (tokens < vocab)], minlength=vocab).astype(np.int64)
    if allowed is not None:
        keep = np.zeros(vocab, dtype=bool)
        keep[allowed] = True
        counts[~keep] = -1  # never chosen before an allowed id
    order = np.lexsort((np.arange(vocab), -counts))
    return np.sort(order[:size])


def shrink_drafter(model: DSparkDraft, ids, target) -> DSparkDraft:
    """A copy of ``model`` whose draft vocabulary is ``ids`` (ascending target ids, each one the
    drafter can draft): the same weights, ``lm_head`` and ``markov_w2`` rows sliced (a shared
    ``lm_head`` gathered from ``target``'s), ``d2t`` set."""
    ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    if ids.ndim != 1 or ids.numel() == 0 or bool((ids[1:] <= ids[:-1]).any()):
        raise InvalidValueError("the draft vocabulary must be a non-empty ascending list of distinct token ids")
    old = model.to_target_ids(torch.arange(model.cfg.out_vocab, device=model.fc.weight.device)).cpu()
    if not bool(torch.isin(ids, old).all()):
        raise InvalidValueError("the draft vocabulary must be a subset of the drafter's own draft vocabulary")
    where = torch.searchsorted(old, ids)  # old draft ids of the kept tokens (both ascend)
    cfg = replace(model.cfg, draft_vocab_size=int(ids.numel()))
    own_head = not model.shared["lm_head"]
    head = OWN if own_head else SharedRows(target.get_output_embeddings(), ids)
    embed = OWN if not model.shared["embed_tokens"] else model.embed_tokens
    new = DSparkDraft(cfg, embed_tokens=embed, lm_head=head)
    state = {k: v for k, v in model.state_dict().items() if k != "d2t"}
    if own_head:
        state["lm_head.weight"] = model.lm_head.weight.detach()[where.to(model.lm_head.weight.device)]
    if "markov_head.markov_w2.weight" in state:
        w2 = state["markov_head.markov_w2.weight"]
        state["markov_head.markov_w2.weight"] = w2[where.to(w2.device)]
    state["d2t"] = ids - torch.arange(ids.numel())
    new.load_state_dict({k: v.to(model.fc.weight.device) for k, v in state.items()}, strict=True)
    new.d2t = new.d2t.long()
    return new.to(dtype=model.fc.weight.dtype).eval()


def shrink_vocab(folder, target, tokens: np.ndarray, size: int, out) -> dict:
    """Write to ``out`` the drafter of ``folder`` restricted to the ``size`` most frequent tokens
    of ``tokens`` (int array) it can draft; returns a summary: sizes, and the share of
    ``tokens`` the kept vocabulary covers."""
    model = load_drafter(folder, target)
    was = model.cfg.out_vocab
    if not 0 < size < was:
        raise InvalidValueError(f"--draft-vocab {size} is invalid: use 1..{was - 1} (fewer tokens than the drafter's "
                                f"draft vocabulary of {was})")
    tokens = np.asarray(tokens, dtype=np.int64)
    allowed = model.to_target_ids(torch.arange(was)).numpy()
    ids = frequent_tokens(tokens, model.cfg.vocab_size, size, allowed)
    small = shrink_drafter(model, ids, target)
    base = json.loads((Path(folder) / "config.json").read_text())  # the target's keys and any others are kept
    save_drafter(small, out, base_config=base, dtype=getattr(torch, str(base.get("torch_dtype", "float16"))))
    covered = float(np.isin(tokens, ids).mean()) if tokens.size else 0.0
    return {"out": str(Path(out)), "draft_vocab_size": int(size), "was": int(was), "coverage": round(covered, 4),
            "tokens_counted": int(tokens.size)}
