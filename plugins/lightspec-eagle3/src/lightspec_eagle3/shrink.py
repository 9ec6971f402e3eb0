"""Restricting a trained head to a reduced draft vocabulary (``lightspec eagle3 shrink-vocab``).

The head's last matmul is ``lm_head [draft_vocab, H]``; on a CPU target with a small model it
is most of a draft token's cost (the zoo head: 3.1M of its 4M multiply-adds per token).  EAGLE-3
trains with a reduced draft vocabulary for that reason.  A head trained on the whole vocabulary
can be restricted afterwards without retraining: its logits over the kept tokens are exactly
the ones it had, so a draft changes only where the whole-vocabulary argmax lay outside the
kept set (docs/design/eagle3.md measures what that costs in accepted length).

The result is the public layout with ``draft_vocab_size``, ``d2t`` and ``t2d``: with an
``lm_head`` of its own its rows are sliced; a head that shares the target's ``lm_head`` keeps
sharing it and LightSpec gathers the target's rows ``i + d2t[i]`` at load.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from lightspec_core import InvalidValueError

from .checkpoint import load_head, save_head
from .data import draft_vocabulary
from .modeling import Eagle3Head


def shrink_head(head: Eagle3Head, vocab_ids: np.ndarray) -> Eagle3Head:
    """A copy of ``head`` whose draft vocabulary is ``vocab_ids`` (ascending target ids, each
    a token the head could draft): same layer weights, ``lm_head`` rows sliced (or the target's
    shared rows), ``d2t``/``t2d`` set."""
    ids = torch.as_tensor(np.asarray(vocab_ids), dtype=torch.long)
    if ids.ndim != 1 or ids.numel() == 0 or bool((ids[1:] <= ids[:-1]).any()):
        raise InvalidValueError("the draft vocabulary must be a non-empty ascending list of distinct token ids")
    old = head.target_ids().cpu()
    if not bool(torch.isin(ids, old).all()):
        raise InvalidValueError("the draft vocabulary must be a subset of the head's own draft vocabulary")
    cfg = replace(head.cfg, draft_vocab_size=int(ids.numel()))
    shared_embed, shared_out = head._shared
    new = Eagle3Head(cfg, own_embed=head.embed_tokens is not None, own_lm_head=head.lm_head is not None,
                     embed=shared_embed, lm_head=shared_out)
    state = {k: v for k, v in head.state_dict().items() if k not in ("d2t", "t2d")}
    if head.lm_head is not None:
        where = torch.searchsorted(old, ids)  # old draft ids of the kept tokens (old ids ascend too)
        state["lm_head.weight"] = head.lm_head.weight.detach()[where.to(head.lm_head.weight.device)]
    state["d2t"] = ids - torch.arange(ids.numel())
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    state["t2d"] = t2d
    new.load_state_dict({k: v.to(head.fc.weight.device) for k, v in state.items()}, strict=True)
    return new.to(dtype=head.fc.weight.dtype).eval()


def shrink_vocab(head_dir, target, tokens: np.ndarray, size: int, out) -> dict:
    """Write to ``out`` the head of ``head_dir`` restricted to the ``size`` most frequent tokens
    of ``tokens`` (int array) that it can draft; returns a summary: sizes, and the share of
    ``tokens`` the kept vocabulary covers."""
    head = load_head(head_dir, target, dtype=torch.float32)
    V = head.cfg.vocab_size
    tokens = np.asarray(tokens, dtype=np.int64)
    if not 0 < size < head.cfg.draft_vocab_size:
        raise InvalidValueError(f"--draft-vocab {size} is invalid: use 1..{head.cfg.draft_vocab_size - 1} (fewer "
                                f"tokens than the head's draft vocabulary of {head.cfg.draft_vocab_size})")
    allowed = head.target_ids().cpu().numpy()
    counts_tokens = tokens[np.isin(tokens, allowed)]
    ids = draft_vocabulary(counts_tokens if counts_tokens.size else tokens, V, size)
    small = shrink_head(head, ids)
    save_head(small, out)
    covered = float(np.isin(tokens, ids).mean()) if tokens.size else 0.0
    return {"out": str(Path(out)), "draft_vocab_size": int(size), "was": int(head.cfg.draft_vocab_size),
            "coverage": round(covered, 4), "tokens_counted": int(tokens.size)}
