"""The ``mtp`` strategy object: finds the head, loads it against the target, drafts.

``head``:

* ``"auto"`` (default): the target's own MTP modules when its checkpoint's ``config.json``
  has ``num_nextn_predict_layers`` (its local folder, or its hub id's snapshot in the Hugging
  Face cache); else, for lightspec-zoo's target, the heads shipped in
  the zoo (``lightspec_zoo/models/mtp``); else an error that asks for ``head=PATH``;
* a folder or a hub id: MTP modules (``num_nextn_predict_layers`` in its config; the target's own
  checkpoint or a module folder from ``lightspec mtplayer train``) or Medusa heads.

After ``setup`` the strategy is ``kind`` ``"mtp"`` (chain) or ``"medusa"`` (chain, and the
tree expansion protocol: ``tree_start(ctx)`` / ``tree_step(tokens, parents)``,
``supports_tree_expansion``; ``head_logprobs(ctx)`` ``[B, K, V]`` and ``head_topk(ctx, k)``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lightspec_core import LightSpecError, hookimpl, model_folder, num_layers

from .drafter import MedusaDraft, MTPChain
from .formats import HeadFitError, load_head, mtp_layer_count, read_config
from .plugin import PARAMS  # noqa: F401  (re-exported: the strategy's parameters)


def target_folder(target) -> Path | None:
    """The folder the target was loaded from: a local folder, or its hub id's snapshot in the
    Hugging Face cache (never downloaded here: transformers fetched its weights); None for a
    model built in memory."""
    name = getattr(target, "name_or_path", "") or getattr(target.config, "_name_or_path", "")
    if not name:
        return None
    try:
        return model_folder(name, what="target", download=False)
    except LightSpecError:
        return None


def zoo_head_for(folder: Path | None) -> Path | None:
    """lightspec-zoo's shipped heads when ``folder`` is the zoo's target (optional package)."""
    if folder is None:
        return None
    try:
        import lightspec_zoo
    except ImportError:
        return None
    try:
        zoo_target = lightspec_zoo.model_path(lightspec_zoo.DEFAULT_TARGET)
    except FileNotFoundError:
        return None
    heads = Path(lightspec_zoo.MODELS_DIR) / "mtp"
    if folder.resolve() == Path(zoo_target).resolve() and (heads / "config.json").is_file():
        return heads
    return None


def resolve_head(target, head: str, progress: bool = False) -> Path:
    folder = target_folder(target)
    if head != "auto":
        return model_folder(head, what="MTP/Medusa head", progress=progress)
    if folder is not None and (folder / "config.json").is_file() and mtp_layer_count(read_config(folder)):
        return folder
    zoo = zoo_head_for(folder)
    if zoo is not None:
        return zoo
    raise LightSpecError(f"strategy 'mtp' found no head for this target ({folder or type(target).__name__}): its config "
                         "has no num_nextn_predict_layers; pass head=PATH (--strategy mtp:head=PATH; MTP modules or Medusa heads, e.g. from "
                         "`lightspec mtplayer train`)")


class MTPStrategy:
    """Drafting with the target's MTP modules or Medusa heads (module docstring)."""

    name = "mtp"

    def __init__(self, head: str = "auto", max_draft: int = 4):
        if not (isinstance(max_draft, int) and not isinstance(max_draft, bool) and max_draft >= 1):
            raise LightSpecError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        if not (isinstance(head, (str, Path)) and str(head)):
            raise LightSpecError(f"head={head!r} is invalid: use 'auto' or the path of a head folder")
        self.head, self.max_draft = str(head), max_draft
        self.kind: str | None = None
        self.impl = None
        self.hidden_layers: list[int] = []
        self.head_path: Path | None = None

    def setup(self, env) -> None:
        """Find and load the head (``HeadFitError`` when it does not fit the target)."""
        self.head_path = resolve_head(env.target, self.head, getattr(env, "progress", False))
        try:
            kind, module = load_head(env.target, self.head_path)
        except HeadFitError as exc:
            raise LightSpecError(f"strategy 'mtp': {exc}") from None
        self.kind = kind
        self.layer = num_layers(env.target)
        self.hidden_layers = [self.layer]
        if kind == "mtp":
            self.impl = MTPChain(module, self.name, self.max_draft)
            params = sum(p.numel() for layer in module for p in layer.parameters())
            head_rows = 0 if module[0].own_head else env.target.get_output_embeddings().weight.numel()
        else:
            self.impl = MedusaDraft(module, self.name, self.max_draft)
            params = sum(p.numel() for p in module.parameters())
            head_rows = 0 if module.own_heads else env.target.get_output_embeddings().weight.numel()
        # a draft step reads the head's own weights and (when shared) the target's lm_head
        self.cost_hint = (params + head_rows) / max(1, sum(p.numel() for p in env.target.parameters()))

    @property
    def supports_tree_expansion(self) -> bool:
        return self.kind == "medusa"

    @property
    def max_tree_depth(self) -> int | None:
        """The deepest token tree ``tree_start`` / ``tree_step`` grow: one level per Medusa
        head (None before ``setup``, or for MTP modules, which grow no trees)."""
        return self.impl.heads.num_heads if self.kind == "medusa" else None

    def reset(self) -> None:
        if self.impl is not None:
            self.impl.reset()

    def draft_cost_hints(self) -> dict[str, float]:
        return {self.name: getattr(self, "cost_hint", 0.0)}

    @hookimpl
    def lightspec_propose(self, ctx):
        return self.impl.propose(ctx, self.layer)

    # -- Medusa: per-head distributions and tree expansion --------------------------------

    def _medusa(self) -> MedusaDraft:
        if self.kind != "medusa":
            raise LightSpecError(f"per-head distributions and tree expansion need Medusa heads; this head "
                                 f"({self.head_path}) is {self.kind or 'not loaded (setup not run)'}")
        return self.impl

    def head_logprobs(self, ctx) -> torch.Tensor:
        """``[B, K, V]`` log-probabilities of each Medusa head at each row's last state
        (head i: the token ``i + 1`` places after the row's last committed token)."""
        return torch.log_softmax(self._medusa().head_logits(ctx, self.layer).float(), dim=-1)

    def head_topk(self, ctx, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs [B, K, k], token ids [B, K, k])``: each head's top-k, best first
        (Medusa choice lists index into these)."""
        return self.head_logprobs(ctx).topk(k, dim=-1)

    def tree_start(self, ctx) -> torch.Tensor:
        """Tree expansion: log-probs ``[B, V]`` of the root's children (head 0)."""
        return self._medusa().tree_start(ctx, self.layer)

    def tree_step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Tree expansion: log-probs ``[B, F, V]`` of the frontier's children; the d-th call's
        frontier is at depth d and gets head d's distribution (0-based)."""
        return self._medusa().tree_step(tokens, parents)
