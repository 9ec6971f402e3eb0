"""Find the parts of a Hugging Face causal LM that speculation needs, generically.

* ``decoder_layers(model)``: the ModuleList of transformer blocks, with its owner.
* ``early_exit_view(model, n)``: the same model using only its first n blocks (weights
  shared, nothing copied) — the self-speculation drafter.
* ``HiddenCapture``: forward hooks that record the hidden states entering the given
  blocks on every forward, so drafters that need them get exactly those layers.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> tuple[list[str], nn.ModuleList]:
    """Return (attribute path from ``model`` to the block list, the block list)."""
    n = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    best: tuple[list[str], nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and (n is None or len(module) == n):
            path = name.split(".")
            if best is None or len(path) < len(best[0]):
                best = (path, module)
    if best is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
    return best


def num_layers(model: nn.Module) -> int:
    return len(decoder_layers(model)[1])


def early_exit_view(model: nn.Module, n_layers: int) -> nn.Module:
    """A shallow copy of ``model`` whose block list holds only its first ``n_layers``
    blocks.  Embeddings, final norm and lm_head are the target's own modules."""
    path, layers = decoder_layers(model)
    if not 1 <= n_layers <= len(layers):
        raise ValueError(f"layers={n_layers} is invalid: use 1..{len(layers)} for this model")
    config = copy.copy(model.config)
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(config, attr) and isinstance(getattr(config, attr), int):
            setattr(config, attr, n_layers)
    root = _shallow(model)
    root.config = config
    owner = root
    for attr in path[:-1]:
        child = _shallow(getattr(owner, attr))
        if hasattr(child, "config"):
            child.config = config
        owner._modules[attr] = child
        owner = child
    owner._modules[path[-1]] = nn.ModuleList(list(layers)[:n_layers])
    return root


def _shallow(module: nn.Module) -> nn.Module:
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


class HiddenCapture:
    """Record hidden states on the forwards of ``model``.

    Layer id ``i`` follows HF's ``output_hidden_states`` numbering: 0 is the embedding
    output, i in 1..N-1 is the output of block i-1 (the input of block i), and N is the
    output of the last block after the final norm.  ``states[i]`` is ``[B, q, H]``.

    ``attached=True`` (default) records every forward from now on, through forward hooks on
    the model's modules, until ``remove()``.  ``attached=False`` leaves the model untouched
    and records only inside ``with capture:`` (the hooks exist for that block alone: the
    target runner does this, so a model passed in by a user carries no hooks of ours).
    """

    def __init__(self, model: nn.Module, layer_ids: list[int], attached: bool = True):
        _, layers = decoder_layers(model)
        n = len(layers)
        self.states: dict[int, torch.Tensor] = {}
        self.handles = []
        self.points = []  # (module, layer id, pre-hook?)
        for i in sorted(set(layer_ids)):
            if not 0 <= i <= n:
                raise ValueError(f"hidden layer id {i} is invalid: use 0..{n} for this model")
            self.points.append((layers[i], i, True) if i < n else (final_norm(model), i, False))
        if attached:
            self._attach()

    def _attach(self) -> None:
        for module, i, pre in self.points:
            if pre:
                self.handles.append(module.register_forward_pre_hook(self._pre_hook(i), with_kwargs=True))
            else:
                self.handles.append(module.register_forward_hook(self._post_hook(i)))

    def __enter__(self) -> "HiddenCapture":
        self._attach()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def _pre_hook(self, i):
        def hook(module, args, kwargs):
            self.states[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _post_hook(self, i):
        def hook(module, args, output):
            self.states[i] = output

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def final_norm(model: nn.Module) -> nn.Module:
    """The final norm module of ``model`` (applied after the last block, before the lm_head)."""
    path, _ = decoder_layers(model)
    owner = model
    for attr in path[:-1]:
        owner = getattr(owner, attr)
    for name in ("norm", "final_layernorm", "ln_f", "final_layer_norm", "norm_f"):
        if hasattr(owner, name):
            return getattr(owner, name)
    raise ValueError(f"cannot find the final norm of {type(model).__name__}")


@torch.no_grad()
def choose_exit_layer(model, tokens: list[int], k: int = 4) -> int:
    """Pick the exit layer L maximising expected tokens per unit of work.

    For each L, a = how often argmax(lm_head(norm(h_L))) equals the full model's argmax on
    ``tokens``; with k drafted tokens a verify yields (1 - a^(k+1)) / (1 - a) tokens and
    costs about 1 + k * L / N full forwards.  Reads ``tokens``' last 128; the model's output
    only (no cache).  Used by layer skip (the core's chain and lightspec-tree's expander).
    """
    n = num_layers(model)
    ids = torch.tensor([tokens[-128:]], device=next(model.parameters()).device)
    out = model(input_ids=ids, output_hidden_states=True)
    full = out.logits.argmax(-1)
    head = model.get_output_embeddings()
    norm = final_norm(model)
    best, best_score = 1, -1.0
    for L in range(1, n):
        agree = float((head(norm(out.hidden_states[L])).argmax(-1) == full).float().mean())
        a = min(agree, 0.999)
        gain = (1 - a ** (k + 1)) / (1 - a)
        score = gain / (1 + k * L / n)
        if score > best_score:
            best, best_score = L, score
    return best
