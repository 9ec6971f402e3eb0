"""The objects that flow through the per-step hooks.

Shapes use B = active rows this step, K = longest draft this step, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .sampling import SamplingParams


@dataclass
class DraftProposal:
    """Draft tokens for every active row.

    tokens:     [B, K] int64; row b's draft is ``tokens[b, :lengths[b]]`` (the rest is padding)
    lengths:    [B] int64
    probs:      [B, K, V] float or None — the warped draft distribution each token was
                sampled from; None means "no probabilities" (n-gram style: verified as one-hot)
    confidence: [B, K] float or None — the drafter's peak probability per slot (for stats/policies)
    entropy:    [B, K] float or None — the drafter's entropy per slot
    source:     component name, or one name per row (for statistics)
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    source: str | list[str] = ""

    def __post_init__(self):
        if self.tokens.dim() != 2:
            raise ValueError(f"DraftProposal.tokens must be [B, K], got shape {tuple(self.tokens.shape)}")
        if self.lengths.shape != (self.tokens.shape[0],):
            raise ValueError(
                f"DraftProposal.lengths must be [B]={self.tokens.shape[0]}, got shape {tuple(self.lengths.shape)}"
            )

    @property
    def max_len(self) -> int:
        return self.tokens.shape[1]

    def source_of(self, row: int) -> str:
        return self.source if isinstance(self.source, str) else self.source[row]

    @staticmethod
    def empty(batch: int, device: torch.device, source: str = "") -> "DraftProposal":
        return DraftProposal(
            tokens=torch.zeros(batch, 0, dtype=torch.long, device=device),
            lengths=torch.zeros(batch, dtype=torch.long, device=device),
            source=source,
        )


@dataclass
class VerifyResult:
    """accepted: [B] int64 number of draft tokens kept per row.
    emitted:  [B, K+1] int64: row b emits ``emitted[b, :accepted[b] + 1]`` (accepted drafts,
              then one corrected or bonus token); the rest is -1."""

    accepted: torch.Tensor
    emitted: torch.Tensor


@dataclass
class Budget:
    """max_draft: [B] int64 most tokens a drafter may propose per row this step (0 = don't draft).
    min_confidence: [B] float — drafters that know their confidence stop a row's draft
    when the peak probability of their next token falls below this.
    by_source: optional {component name: [B] Python ints} — a tighter limit for one
    component (combinations apply it to that component; it never exceeds max_draft).
    free_max_draft: optional [B] Python ints >= max_draft — a looser limit for model-free
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
        them catching its cache up, for drafts of at most ``tokens`` tokens per row."""
        self.model_s += seconds
        self.setup_s += setup_s
        spent, n = self.by_source.get(source, (0.0, 0))
        self.by_source[source] = (spent + seconds - setup_s, max(n, tokens))


@dataclass
class RowHistory:
    """Online acceptance statistics of one request (decayed sums, see ``budget.py``)."""

    accepted: float = 0.0  # decayed count of accepted draft tokens
    rejected: float = 0.0  # decayed count of rejections (verifies that stopped early)
    drafted: int = 0
    accepted_total: int = 0
    steps: int = 0
    idle_steps: int = 0  # consecutive steps without a draft

    def acceptance(self, prior: float = 0.6, prior_weight: float = 2.0) -> float:
        """Estimated per-token acceptance probability (geometric model, with a prior)."""
        return (self.accepted + prior * prior_weight) / (self.accepted + self.rejected + prior_weight)


@dataclass
class StepContext:
    """What a component sees at one decode step.

    sequences:   one Python list of token ids per active row (prompt + emitted so far;
                 the last element is the newest token, not yet run through the target)
    row_ids:     the request index of each active row (rows leave the batch when done)
    max_draft:   [B] int64 and ``max_draft_list`` (Python ints) from the budget policy
                 (read-only: the tensor may be one the budget reuses from step to step)
    min_confidence: [B] float from the budget policy
    sampling:    the request's ``SamplingParams`` (warp draft logits with ``sampling.warped_probs``)
    generators:  one ``torch.Generator`` per row for the drafter's own sampling
    hidden_states: {layer id: [B, q, H]} captured on the last target forward, for the
                 layers the components asked for; ``hidden_positions`` [B] says which of the
                 q slots holds the newest accepted token of each row
    history:     one ``RowHistory`` per row
    prefix / prefix_lengths: [B, P] / [B] tokens another drafter already proposed this step
                 (cascades): a drafter continues after them
    budget_by_source: per-component limits from the budget policy (see ``Budget.by_source``)
    free_max_draft_list: the looser limit for model-free drafters (``Budget.free_max_draft``),
                 or None: ``max_draft_list`` for every drafter
    deterministic: every request is seeded: budget policies must decide from acceptance
                 alone (not timing), so a seeded request reproduces exactly
    draft_cost_hints: ``{source: cost of one draft token relative to a target step}`` from
                 the strategy's ``draft_cost_hints()`` (timing-free structural estimates)
    timer:       model drafters call ``timer.record(name, seconds, tokens, setup_s)``: the
                 budget prices each drafter from it (see ``StepTimer``)
    """

    step: int
    sequences: list[list[int]]
    row_ids: list[int]
    max_draft: torch.Tensor
    max_draft_list: list[int]
    min_confidence: torch.Tensor
    sampling: SamplingParams
    generators: list[torch.Generator]
    history: list[RowHistory]
    target: Any
    tokenizer: Any
    device: torch.device
    vocab_size: int
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)
    hidden_positions: torch.Tensor | None = None
    prefix: torch.Tensor | None = None
    prefix_lengths: torch.Tensor | None = None
    budget_by_source: dict[str, list[int]] = field(default_factory=dict)
    free_max_draft_list: list[int] | None = None
    deterministic: bool = False  # seeded sampling: policies must not depend on timing
    timer: StepTimer = field(default_factory=StepTimer)  # drafters record their model forward time here
    draft_cost_hints: dict[str, float] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return len(self.sequences)

    def with_budget(self, max_draft: torch.Tensor, max_draft_list: list[int] | None = None) -> "StepContext":
        """A shallow copy with another draft budget (used by combinations)."""
        c = object.__new__(StepContext)  # copy.copy's reduce protocol costs ~10 us a call here
        c.__dict__.update(self.__dict__)
        c.max_draft = max_draft
        c.max_draft_list = max_draft.tolist() if max_draft_list is None else max_draft_list
        return c
