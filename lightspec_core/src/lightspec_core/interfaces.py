"""The objects that flow through the per-step hooks: what a drafter proposes, what a
verifier decides, what a budget policy allows, and the step context they all read.

Shapes: B = active rows this step, N = the most draft nodes of a row this step, V = the
vocabulary, H = the hidden size.  A draft is a token tree: node j of row b holds token
``tokens[b, j]`` and hangs under node ``parents[b, j]`` (-1: under the row's last committed
token).  A chain (``parents is None``) is the one-branch tree: node j's parent is j - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .sampling import SamplingParams


@dataclass
class SparseProbs:
    """Draft probabilities given as each node's top-k: ``ids [B, N, k]`` int64 token ids and
    ``probs [B, N, k]`` float (probability mass outside the k ids is 0).  A head with a
    reduced draft vocabulary reports these instead of a ``[B, N, V]`` tensor."""

    ids: torch.Tensor
    probs: torch.Tensor

    def __post_init__(self):
        if self.ids.dim() != 3 or self.ids.shape != self.probs.shape:
            raise ValueError(f"SparseProbs: ids and probs must both be [B, N, k], got {tuple(self.ids.shape)} "
                             f"and {tuple(self.probs.shape)}")

    def dense(self, vocab: int) -> torch.Tensor:
        """``[B, N, V]`` float32 with the k probabilities in place, zeros elsewhere."""
        B, N, _ = self.ids.shape
        out = torch.zeros(B, N, vocab, dtype=torch.float32, device=self.ids.device)
        return out.scatter_(2, self.ids, self.probs.float())

    def of_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[B, N]``: each node's probability of its own token ``tokens [B, N]`` (0 if not in its top-k)."""
        hit = self.ids == tokens[:, :, None]
        return (self.probs.float() * hit).sum(-1)


@dataclass
class DraftProposal:
    """Draft tokens for every active row, as a token tree per row.

    tokens:     [B, N] int64; row b's nodes are ``tokens[b, :lengths[b]]`` (the rest is padding)
    lengths:    [B] int64, 0 <= lengths[b] <= N
    parents:    [B, N] int64 or None.  ``parents[b, j]`` is the node that node j continues
                (``-1``: the row's last committed token), and ``parents[b, j] < j``
                (topological order).  None: a chain, node j continues node j - 1.
    probs:      the warped draft distribution each node's token was drawn from: [B, N, V]
                float, a ``SparseProbs``, or None ("no probabilities": verified as one-hot,
                n-gram style).  In a tree, siblings must have been drawn independently from
                one distribution (their parent's), so siblings carry equal rows.
    confidence: [B, N] float or None: the drafter's peak probability at each node (statistics, policies)
    entropy:    [B, N] float or None: the drafter's entropy at each node
    source:     component name, or one name per row (statistics)
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    probs: torch.Tensor | SparseProbs | None = None
    confidence: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    source: str | list[str] = ""
    parents: torch.Tensor | None = None

    def __post_init__(self):
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.dim() != 2:
            shape = tuple(self.tokens.shape) if isinstance(self.tokens, torch.Tensor) else type(self.tokens).__name__
            raise ValueError(f"DraftProposal.tokens must be a [B, N] tensor, got {shape}")
        if not isinstance(self.lengths, torch.Tensor) or self.lengths.shape != (self.tokens.shape[0],):
            shape = tuple(self.lengths.shape) if isinstance(self.lengths, torch.Tensor) else type(self.lengths).__name__
            raise ValueError(f"DraftProposal.lengths must be [B]={self.tokens.shape[0]}, got {shape}")
        if self.parents is not None and (not isinstance(self.parents, torch.Tensor) or self.parents.shape != self.tokens.shape):
            shape = tuple(self.parents.shape) if isinstance(self.parents, torch.Tensor) else type(self.parents).__name__
            raise ValueError(f"DraftProposal.parents must be [B, N]={tuple(self.tokens.shape)} or None, got {shape}")

    @property
    def max_len(self) -> int:
        """N, the node slots per row."""
        return self.tokens.shape[1]

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    def source_of(self, row: int) -> str:
        return self.source if isinstance(self.source, str) else self.source[row]

    def node_rows(self) -> list[list[int]]:
        """Each row's real draft tokens as Python lists (``tokens[b, :lengths[b]]``), computed
        once per proposal (the engine's check, the verifier and the statistics share them)."""
        rows = self.__dict__.get("_node_rows")
        if rows is None:
            rows = self.__dict__["_node_rows"] = [r[:n] for r, n in zip(self.tokens.tolist(), self.lengths.tolist())]
        return rows

    def parent_rows(self) -> list[list[int]] | None:
        """Each row's real nodes' parents as Python lists; None for a chain."""
        if self.parents is None:
            return None
        rows = self.__dict__.get("_parent_rows")
        if rows is None:
            rows = self.__dict__["_parent_rows"] = [r[:n] for r, n in zip(self.parents.tolist(), self.lengths.tolist())]
        return rows

    def depth_rows(self) -> list[int]:
        """Each row's draft depth: the number of nodes on its longest root-to-leaf path (its
        length for a chain, 0 for no draft).  A verify accepts at most this many nodes, so a
        tree accepted to its depth was not rejected anywhere it could have been."""
        parents = self.parent_rows()
        if parents is None:
            return self.lengths.tolist()
        depths = []
        for par in parents:
            level: list[int] = []
            for p in par:  # parents come before their children
                level.append(1 if p < 0 else level[p] + 1)
            depths.append(max(level, default=0))
        return depths

    def forget_rows(self) -> None:
        """Drop the cached lists (after changing ``tokens``, ``lengths`` or ``parents`` in place)."""
        self.__dict__.pop("_node_rows", None)
        self.__dict__.pop("_parent_rows", None)

    @staticmethod
    def empty(batch: int, device: torch.device, source: str = "") -> "DraftProposal":
        return DraftProposal(
            tokens=torch.zeros(batch, 0, dtype=torch.long, device=device),
            lengths=torch.zeros(batch, dtype=torch.long, device=device),
            source=source,
        )


@dataclass
class VerifyResult:
    """What a verifier kept, per row.  Tensors or Python lists are both accepted.

    accepted: [B] int64: how many draft nodes row b keeps
    emitted:  [B, N+1] int64: row b emits ``emitted[b, :accepted[b] + 1]``: the kept nodes'
              tokens in path order, then one corrected or bonus token (the rest is -1)
    path:     [B, N] int64 or None: the kept nodes' indices (into the proposal's nodes), root
              first, -1 padded.  None: a chain, where row b keeps nodes ``0 .. accepted[b]-1``.
              The commit keeps exactly these nodes' KV slots.
    """

    accepted: torch.Tensor | list[int]
    emitted: torch.Tensor | list[list[int]]
    path: torch.Tensor | list[list[int]] | None = None

    def as_lists(self) -> tuple[list[int], list[list[int]], list[list[int]] | None]:
        """(accepted [B], each row's emitted tokens (accepted + 1 of them), each row's kept node
        indices or None for a chain) as Python lists: one device sync for each tensor field."""
        acc = self.accepted.tolist() if isinstance(self.accepted, torch.Tensor) else list(self.accepted)
        em = self.emitted.tolist() if isinstance(self.emitted, torch.Tensor) else self.emitted
        rows = [list(e[: a + 1]) for e, a in zip(em, acc)]
        if self.path is None:
            return acc, rows, None
        pa = self.path.tolist() if isinstance(self.path, torch.Tensor) else self.path
        return acc, rows, [list(p[:a]) for p, a in zip(pa, acc)]


@dataclass
class Budget:
    """What a budget policy allows this step.

    max_draft: [B] int64 most draft nodes a row may propose this step (0 = don't draft).
    min_confidence: [B] float: drafters that know their confidence stop a row's draft when
    the peak probability of their next token falls below this.
    by_source: optional {component name: [B] Python ints}: a tighter limit for one
    component (combinations apply it to that component; it never exceeds max_draft).
    free_max_draft: optional [B] Python ints >= max_draft: a looser limit for model-free
    drafters (n-gram lookup: a draft costs them nothing to make, only verify width), which
    cut their drafts themselves by how far they expect them to hold; ``None``: max_draft
    limits every drafter.  Only drafters that read ``StepContext.free_max_draft_list`` use it.
    reason: why the policy chose this (one word or short phrase, e.g. ``"calibrating"``,
    ``"hold"``, ``"model"``), for the per-step statistics (``StepStats.budget_reason``).
    estimates: the policy's numbers behind the choice (e.g. ``{"acceptance": 0.7,
    "beta": 0.2}``), copied into ``StepStats.budget_estimates`` so a budget curve can be
    drawn from the JSONL; keep it small (a few floats)."""

    max_draft: torch.Tensor
    min_confidence: torch.Tensor
    by_source: dict[str, list[int]] = field(default_factory=dict)
    free_max_draft: list[int] | None = None
    reason: str = ""
    estimates: dict[str, float] = field(default_factory=dict)


@dataclass
class StepTimer:
    """Shared by a step's context and its copies: drafters add their model time here.

    A drafter that runs model forwards calls ``record`` once per step; one that only adds
    to ``model_s`` is still timed, but the budget can then price it only on steps where it
    is the sole drafter (in a cascade, rows drafted by different components share a step)."""

    model_s: float = 0.0
    setup_s: float = 0.0  # part of model_s spent catching a drafter up (e.g. its first prefill): not a per-token cost
    # per drafter: (seconds of model forwards, setup excluded; draft tokens its longest row got)
    by_source: dict[str, tuple[float, int]] = field(default_factory=dict)

    def record(self, source: str, seconds: float, tokens: int, setup_s: float = 0.0) -> None:
        """Add one drafter's model time for this step: ``seconds`` in all, ``setup_s`` of
        them catching its cache up, for drafts of at most ``tokens`` tokens per row.

        Report as ``setup_s`` a catch-up longer than a step's accepted tokens (the prompt at
        the generation's first draft, the tokens decoded while the drafter did not draft):
        the budget charges it to the step that resumes the drafter (``dynamic``: the first
        draft of a generation apart from later resumes), not to each draft token."""
        self.model_s += seconds
        self.setup_s += setup_s
        spent, n = self.by_source.get(source, (0.0, 0))
        self.by_source[source] = (spent + seconds - setup_s, max(n, tokens))


@dataclass
class RowHistory:
    """Online acceptance statistics of one request (decayed sums, see ``lightspec_core.budget``)."""

    accepted: float = 0.0  # decayed count of accepted draft tokens
    rejected: float = 0.0  # decayed count of rejections (verifies that stopped early)
    drafted: int = 0  # draft levels verified (a chain's length, a tree's depth)
    accepted_total: int = 0
    steps: int = 0
    idle_steps: int = 0  # consecutive steps without a draft

    def acceptance(self, prior: float = 0.6, prior_weight: float = 2.0) -> float:
        """Estimated per-token acceptance probability (geometric model, with a prior)."""
        return (self.accepted + prior * prior_weight) / (self.accepted + self.rejected + prior_weight)


@dataclass
class StepContext:
    """What a component sees at one decode step (B = active rows).

    Rows and requests
      step:          decode step, from 1 (the first token of a request comes from the prefill)
      sequences:     one read-only tuple of token ids per row: prompt + emitted so far; the last
                     one is the newest token, not yet run through the target
      row_ids:       the request index of each row (rows leave the batch when done)
      prompt_lengths: each row's prompt length (its first ``prompt_lengths[b]`` tokens of
                     ``sequences[b]``); empty where the caller does not know them
      history:       one ``RowHistory`` per row (decayed acceptance)
      sampling:      the requests' ``SamplingParams`` (warp draft logits with ``warped_probs``)
      deterministic: every request is seeded: budget policies must decide from acceptance
                     alone (not timing), so a seeded request reproduces exactly
      generators:    one ``torch.Generator`` per row: the drafter's own stream during
                     ``propose``, the verifier's during ``verify``
    The target
      target, tokenizer, device, vocab_size: the target model and its environment
      runner:        the ``TargetRunner`` that runs the target (its KV cache: ``runner.kv``)
    Budget (set before ``propose``; read-only, the tensors may be reused from step to step)
      max_draft, max_draft_list: [B] int64 and Python ints: most draft nodes per row
      min_confidence: [B] float: stop a row's draft when the drafter's peak probability falls below
      budget_by_source: per-component limits (``Budget.by_source``)
      free_max_draft_list: the looser limit for model-free drafters, or None
      draft_cost_hints: ``{source: cost of one draft token relative to a target step}`` from
                     the strategy's ``draft_cost_hints()`` (timing-free structural estimates)
    Target hidden states (only the layers the strategy lists in ``hidden_layers``)
      hidden_states: {layer id: [B, n, H]}: the target's states of the tokens committed since
                     this strategy's last successful ``propose``, in sequence order
      hidden_positions: [B] int64: the position in ``sequences[b]`` of the token whose state is
                     ``hidden_states[i][b, 0]``
      hidden_lengths: [B] int64: how many of the n states are real for row b; state j of row b
                     belongs to token ``sequences[b][hidden_positions[b] + j]``, and
                     ``hidden_positions[b] + hidden_lengths[b] == len(sequences[b]) - 1``
    Composition
      prefix, prefix_lengths: [B, P] / [B]: what earlier drafters of a cascade already proposed
                     this step (a chain): a drafter continues after it
    Timing
      timer:         model drafters call ``timer.record(name, seconds, tokens, setup_s)``: the
                     budget prices each drafter from it (``StepTimer``)
    """

    step: int
    sequences: Sequence[Sequence[int]]
    row_ids: list[int]
    prompt_lengths: list[int] = field(default_factory=list)
    max_draft: torch.Tensor | None = None
    max_draft_list: list[int] = field(default_factory=list)
    min_confidence: torch.Tensor | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    generators: list[torch.Generator] = field(default_factory=list)
    history: list[RowHistory] = field(default_factory=list)
    target: Any = None
    tokenizer: Any = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    vocab_size: int = 0
    runner: Any = None
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)
    hidden_positions: torch.Tensor | None = None
    hidden_lengths: torch.Tensor | None = None
    prefix: torch.Tensor | None = None
    prefix_lengths: torch.Tensor | None = None
    budget_by_source: dict[str, list[int]] = field(default_factory=dict)
    free_max_draft_list: list[int] | None = None
    deterministic: bool = False
    timer: StepTimer = field(default_factory=StepTimer)
    draft_cost_hints: dict[str, float] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return len(self.row_ids)

    def with_budget(self, max_draft: torch.Tensor, max_draft_list: list[int] | None = None) -> "StepContext":
        """A shallow copy with another draft budget (used by combinations)."""
        c = object.__new__(StepContext)  # copy.copy's reduce protocol costs ~10 us a call here
        c.__dict__.update(self.__dict__)
        c.max_draft = max_draft
        c.max_draft_list = max_draft.tolist() if max_draft_list is None else max_draft_list
        return c
