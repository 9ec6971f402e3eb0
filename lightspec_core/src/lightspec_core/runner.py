"""The target runner: the target model behind one interface for the engine, verifiers and
drafters (public: ``TargetRunner``, ``TargetOutput``).

It owns the target's KV cache for the running batch (``runner.kv``, a ``KVCache``), picks
the fastest exact forward (LightSpec's lean forward where it reproduces HF's bit for bit,
``lean_decoder.exact_lean_target``; HF's own otherwise), captures the hidden states the
strategy asked for, and returns a ``TargetOutput`` whose logits are computed per slot when
asked: a greedy verifier that reads the first few slots of a wide draft never pays for
the lm_head over the rest (on the zoo target the lm_head over 17 positions was ~1 ms of a
~3 ms verify).  Speed tricks (lazy lm_head, fused argmax, CPU kernels, chained forwards)
live here and in the modules it calls, never in the engine's step.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Sequence

import torch

from .interfaces import DraftProposal
from .kvcache import KVCache, takes_logits_to_keep
from .lean_decoder import exact_lean_target
from .model_parts import HiddenCapture
from .sampling import argmax_last


class TargetOutput:
    """One target forward over slots ``[B, Q]``: logits per slot on demand, hidden states.

    Slots are addressed flat: slot ``j`` of row ``b`` is ``b * Q + j``.  For a verify
    forward, slot 0 of a row is its last committed token and slot ``1 + i`` its draft node i.
    ``head_s`` accumulates the seconds spent computing logits on demand (target compute,
    for the statistics).
    """

    def __init__(self, batch: int, slots: int, hidden: torch.Tensor | None, logits: torch.Tensor | None,
                 states: dict[int, torch.Tensor], head=None, head_argmax=None, first_slot: int = 0):
        self.batch, self.slots = batch, slots
        self._hidden = hidden  # [B, Q, H] final-norm output when logits are lazy
        self._logits = logits  # [B, Q', V] when the forward computed them (Q' = Q - first_slot)
        self._states = states
        self._head, self._head_argmax = head, head_argmax
        self._first = first_slot  # eager logits exist only from this slot on (a prefill's logits_to_keep)
        self.head_s = 0.0

    @property
    def logits(self) -> torch.Tensor:
        """All logits ``[B, Q, V]`` (computed once, on first access, when lazy)."""
        if self._logits is None:
            t = time.perf_counter()
            self._logits = self._head(self._hidden)
            self.head_s += time.perf_counter() - t
        if self._first:
            raise ValueError(f"this output has logits only from slot {self._first} on; use logits_at")
        return self._logits

    def _rows(self, flat: Sequence[int] | torch.Tensor, source: torch.Tensor, first: int = 0) -> torch.Tensor:
        """``source [B, Q', X]`` at the flat slots → ``[n, X]`` (a view when they are one run);
        ``first``: ``source`` holds only slots ``first ..`` of each row (Q' = Q - first)."""
        Q = source.shape[1]
        if first:
            flat = [f - first * (f // self.slots + 1) for f in flat]
        if isinstance(flat, torch.Tensor):
            return source.reshape(-1, source.shape[-1]).index_select(0, flat)
        n = len(flat)
        if n and flat[-1] - flat[0] == n - 1 and list(flat) == list(range(flat[0], flat[0] + n)):
            b, j = divmod(flat[0], Q)
            if j + n <= Q:  # one row's consecutive slots
                return source[b, j : j + n]
            if j == 0 and n % Q == 0:  # whole rows
                return source[b : b + n // Q].reshape(n, source.shape[-1])
        index = torch.tensor(flat, dtype=torch.long, device=source.device)
        return source.reshape(-1, source.shape[-1]).index_select(0, index)

    def logits_at(self, flat: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Logits ``[n, V]`` at the given flat slots, the lm_head applied to those slots only."""
        if self._logits is not None:
            return self._rows(flat, self._logits, self._first)
        t = time.perf_counter()
        out = self._head(self._rows(flat, self._hidden))
        self.head_s += time.perf_counter() - t
        return out

    def argmax_at(self, flat: Sequence[int]) -> list[int]:
        """The target's greedy token (first maximum) at each of the given flat slots, fused
        into the lm_head where the runner has a fused kernel."""
        if self._logits is not None:
            return argmax_last(self._rows(flat, self._logits, self._first)).tolist()
        t = time.perf_counter()
        out = self._head_argmax(self._rows(flat, self._hidden)).reshape(-1).tolist()
        self.head_s += time.perf_counter() - t
        return out

    @property
    def captured(self) -> dict[int, torch.Tensor]:
        """Every captured layer's states ``{layer: [B, Q, H]}`` (empty when none was asked for)."""
        return self._states

    def hidden_states_at(self, layer: int, flat: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The captured states ``[n, H]`` of ``layer`` at the given flat slots."""
        return self._rows(flat, self.hidden_states(layer))

    def hidden_states(self, layer: int) -> torch.Tensor:
        """The target's hidden states ``[B, Q, H]`` of ``layer`` (HF ``output_hidden_states``
        numbering) at every slot; only layers the runner was asked to capture."""
        if layer not in self._states:
            raise KeyError(f"layer {layer} was not captured; captured: {sorted(self._states)} (list it in the "
                           f"strategy's hidden_layers)")
        return self._states[layer]


class TargetRunner:
    """Runs the target over a batch's KV cache.

    ``model``: the HF causal LM; ``forward_kind``: ``"lean"`` or ``"hf"``; ``vocab_size``;
    ``hidden_layers``: the layers captured on every forward; ``kv``: the running batch's
    ``KVCache`` (after ``start``).  A drafter reads ``runner.kv`` (e.g. to copy the keys of
    the target's first layers, ``KVCache.copy_from``) but never writes it.
    """

    def __init__(self, model: torch.nn.Module, hidden_layers: Sequence[int] = (), lean: bool = True):
        self.model = model
        lean_fwd = exact_lean_target(model) if lean else None
        self.forward_kind = "lean" if lean_fwd is not None else "hf"
        self.lean = lean_fwd
        self.net = lean_fwd if lean_fwd is not None else model  # what the KV cache runs
        self.keeps_logits = takes_logits_to_keep(self.net)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.hidden_layers = sorted(set(hidden_layers))
        self.capture = None
        if self.hidden_layers:
            self.capture = (lean_fwd.capture(self.hidden_layers) if lean_fwd is not None
                            else HiddenCapture(model, self.hidden_layers, attached=False))
        self.kv: KVCache | None = None
        self.device = next(model.parameters()).device
        self.model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        self._trees: bool | None = None

    def start(self, batch: int, capacity: int) -> None:
        """A new, empty KV cache for ``batch`` rows (slabs of ``capacity`` columns, grown on demand)."""
        self.kv = KVCache(self.net, batch, self.device, capacity=capacity)

    @property
    def lengths(self) -> list[int]:
        return self.kv.lengths

    def _states(self) -> dict[int, torch.Tensor]:
        return dict(self.capture.states) if self.capture is not None else {}

    def _output(self, out, B: int, Q: int, first_slot: int = 0) -> TargetOutput:
        lean = self.lean
        if getattr(out, "logits", None) is None:  # the lean forward without its lm_head
            return TargetOutput(B, Q, out.hidden, None, self._states(), lean.head_logits, lean.head_argmax)
        return TargetOutput(B, Q, None, out.logits, self._states(), first_slot=first_slot)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> TargetOutput:
        """Run the prompts (right-padded into ``[B, P]``) into a fresh cache (``start`` first).
        The output has logits at least at each row's last prompt slot."""
        B, lens = len(prompts), [len(p) for p in prompts]
        P = max(lens)
        ids = torch.zeros(B, P, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p)
        valid = None
        if min(lens) != P:
            valid = (torch.arange(P)[None, :] < torch.tensor(lens)[:, None]).to(self.device)
        if self.lean is not None:
            return self._output(self.kv.forward(ids.to(self.device), valid, head=False), B, P)
        # logits only from the shortest row's last position on, as HF generate's prefill does
        # (logits_to_keep): the lm_head over a whole prompt is a large, useless matmul
        keep = P - min(lens) + 1 if self.keeps_logits else P
        extra = {"logits_to_keep": keep} if self.keeps_logits else {}
        with self._hooks():
            out = self.kv.forward(ids.to(self.device), valid, **extra)
        return self._output(out, B, P, first_slot=P - keep)

    def _hooks(self):
        """The HF forward's hidden-state hooks, on the model for one forward only."""
        return self.capture if isinstance(self.capture, HiddenCapture) else nullcontext()

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, tree: torch.Tensor | None = None) -> TargetOutput:
        """Append ``tokens [B, Q]`` (``valid [B, Q]``: real slots, each row's first; ``tree [B, Q]``:
        each slot's parent slot, -1 = continues the cache) to the cache and run the target."""
        if self.lean is not None:
            out = self.kv.forward(tokens, valid, tree, head=False)
        else:
            with self._hooks():
                out = self.kv.forward(tokens, valid, tree)
        return self._output(out, tokens.shape[0], tokens.shape[1])

    def verify_forward(self, last: list[int], proposal: DraftProposal | None, nodes: list[list[int]] | None,
                       parents: list[list[int]] | None) -> TargetOutput:
        """One forward over each row's ``[last committed token, draft nodes...]``.

        ``nodes``: each row's real draft tokens (Python lists; None or empty: a plain step);
        ``parents``: each row's node parents (None: chains).  A tree gets its mask and depth
        positions; slot 0 of a row is its last token, slot ``1 + i`` its node i."""
        dev = self.device
        if proposal is None:
            return self.forward(torch.tensor(last, device=dev)[:, None])
        K = proposal.max_len
        inp = torch.tensor([[t] + row + [0] * (K - len(row)) for t, row in zip(last, nodes)], device=dev)
        valid = None
        if any(len(row) < K for row in nodes):
            valid = torch.tensor([[j <= len(row) for j in range(K + 1)] for row in nodes], device=dev)
        tree = None
        if parents is not None:
            tree = torch.tensor([[-1] + [p + 1 for p in par] + [-1] * (K - len(par)) for par in parents],
                                dtype=torch.long, device=dev)
        return self.forward(inp, valid, tree)

    def commit(self, start: list[int], slots: list[list[int]]) -> None:
        """Keep, of the last forward, row b's slots ``slots[b]`` (``KVCache.commit``)."""
        self.kv.commit(start, slots)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.kv.select_rows(rows)

    def supports_trees(self) -> bool:
        """Whether a token tree can be verified on this target: its forward takes a custom
        attention mask over the new slots (LightSpec's lean forward does; an HF forward is
        checked once, on a probe: a two-branch tree against each branch run as a chain)."""
        if self._trees is None:
            self._trees = self.lean is not None or _tree_probe(self.net, self.device)
        return self._trees


@torch.inference_mode()
def _tree_probe(model: torch.nn.Module, device: torch.device) -> bool:
    """A tree ``[root, a, b]`` (a and b both children of the root) after a short prefix: are
    b's logits those of the chain ``[root, b]``?  Any error means no.

    In float32 they must agree to 1e-3.  In 16-bit dtypes the two forwards round differently
    (on the CPU in bfloat16 they differ by ~1e-2 on tiny models), so there b's logits must be
    within 3e-2 of the chain ``[root, b]`` and at least four times closer to it than to the
    chain ``[root, a, b]``, which is what a forward that ignores the tree mask computes."""
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prefix, (root, a, b) = torch.randint(0, vocab, (1, 5), generator=g), torch.randint(0, vocab, (3,), generator=g).tolist()
    try:
        tree_kv, chain_kv = KVCache(model, 1, device, capacity=16), KVCache(model, 1, device, capacity=16)
        tree_kv.forward(prefix.to(device))
        chain_kv.forward(prefix.to(device))
        tree_out = tree_kv.forward(torch.tensor([[root, a, b]], device=device),
                                   tree=torch.tensor([[-1, 0, 0]], device=device)).logits
        chain_out = chain_kv.forward(torch.tensor([[root, b]], device=device)).logits
        got, want = tree_out[0, 2].float(), chain_out[0, 1].float()
        if tree_out.dtype == torch.float32:
            return bool(torch.allclose(got, want, atol=1e-3, rtol=1e-3))
        unmasked_kv = KVCache(model, 1, device, capacity=16)
        unmasked_kv.forward(prefix.to(device))
        unmasked = unmasked_kv.forward(torch.tensor([[root, a, b]], device=device)).logits[0, 2].float()
    except Exception:  # noqa: BLE001 - any failure of the probe means "no trees here"
        return False
    scale = want.abs().max().clamp_min(1.0)
    off = float((got - want).abs().max() / scale)
    return off <= 3e-2 and 4 * off < float((got - unmasked).abs().max() / scale)
