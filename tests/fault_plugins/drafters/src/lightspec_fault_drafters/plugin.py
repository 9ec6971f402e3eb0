"""Strategies that misbehave in one way each, for the engine's fault-injection tests.

Every one drafts like a 1-gram lookup (row b's draft: the tokens that followed the last
earlier occurrence of its newest token, up to the budget) and then breaks one rule:

* ``raises_midway``     ``propose`` raises ``RuntimeError`` on every call after the first
  ``after`` (default 3) calls of a ``generate()``;
* ``float_ids``         the draft tokens come as a float32 tensor (``mode="integral"``: the
  right ids as floats; ``"fractional"``: id + 0.5);
* ``mutates_sequences`` changes ``ctx.sequences`` in place before proposing: appends token
  3 to every row given as a list (``how="append"``: ``seq.append(3)``, ``"iadd"``:
  ``seq += [3]``);
* ``zero_probs``        samples each draft token uniformly from ids 3..V-1 with the row's
  draft generator and reports ``probs`` uniform over the vocabulary except at the proposed
  token, where it is 0 (``mode="zero"``), -0.5 (``"negative"``), NaN (``"nan"``) or 1e-30
  (``"tiny"``): a distribution the token cannot have been drawn from.  ``mode="correct"``
  (the tests' control) reports the true one: 1/(V-3) on ids 3..V-1, 0 on 0..2;
* ``out_of_vocab``      the first draft token of every row is ``V`` (``mode="vocab"``),
  ``V + 1000`` (``"huge"``) or -1 (``"negative"``), V = ``ctx.vocab_size``.

``CALLS`` counts ``propose`` calls per strategy name (tests check the drafter ran).
"""

from __future__ import annotations

from lightspec_core import hookimpl

CALLS: dict[str, int] = {}


def lookup_drafts(ctx) -> list[list[int]]:
    """Per row: what followed the last earlier occurrence of the newest token, at most the
    row's budget ``ctx.max_draft_list[b]`` tokens (empty when there is none)."""
    drafts = []
    for b, seq in enumerate(ctx.sequences):
        seq = list(seq)
        k = int(ctx.max_draft_list[b])
        draft: list[int] = []
        if k > 0 and len(seq) >= 2:
            last = seq[-1]
            for i in range(len(seq) - 2, -1, -1):
                if seq[i] == last:
                    draft = seq[i + 1 : i + 1 + k]
                    break
        drafts.append(draft)
    return drafts


def proposal(ctx, drafts: list[list[int]], name: str, dtype=None, probs=None):
    """A ``DraftProposal`` of ``drafts`` (padded with 0), or None when every row is empty."""
    import torch

    from lightspec_core import DraftProposal

    width = max((len(d) for d in drafts), default=0)
    if width == 0:
        return None
    tokens = torch.zeros(len(drafts), width, dtype=torch.long)
    for b, d in enumerate(drafts):
        if d:
            tokens[b, : len(d)] = torch.tensor(d, dtype=torch.long)
    if dtype is not None:
        tokens = tokens.to(dtype)
    lengths = torch.tensor([len(d) for d in drafts], dtype=torch.long)
    if probs is not None:
        probs = probs[:, :width].to(ctx.device)
    return DraftProposal(tokens=tokens.to(ctx.device), lengths=lengths.to(ctx.device), probs=probs, source=name)


def _check(option: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{option}={value!r} is invalid; allowed: {', '.join(map(repr, allowed))}")


class _Faulty:
    name = "faulty"

    def reset(self) -> None:
        self.calls = 0

    def count(self) -> None:
        self.calls = getattr(self, "calls", 0) + 1
        CALLS[self.name] = CALLS.get(self.name, 0) + 1


class RaisesMidway(_Faulty):
    """Drafts by lookup for ``after`` calls, then raises on every call."""

    name = "raises_midway"

    def __init__(self, after: int = 3):
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ValueError(f"after={after!r} is invalid: use an integer >= 0")
        self.after = after
        self.calls = 0

    @hookimpl
    def lightspec_propose(self, ctx):
        self.count()
        if self.calls > self.after:
            raise RuntimeError(f"raises_midway: propose call {self.calls} fails (after {self.after})")
        return proposal(ctx, lookup_drafts(ctx), self.name)


class FloatIds(_Faulty):
    """Lookup drafts returned as a float32 tensor."""

    name = "float_ids"

    def __init__(self, mode: str = "integral"):
        _check("mode", mode, ("integral", "fractional"))
        self.mode = mode

    @hookimpl
    def lightspec_propose(self, ctx):
        import torch

        self.count()
        p = proposal(ctx, lookup_drafts(ctx), self.name, dtype=torch.float32)
        if p is not None and self.mode == "fractional":
            p.tokens += 0.5
        return p


class MutatesSequences(_Faulty):
    """Appends token 3 to every ``ctx.sequences`` row that is a list, then drafts by lookup
    from the sequences as they were."""

    name = "mutates_sequences"

    def __init__(self, how: str = "append"):
        _check("how", how, ("append", "iadd"))
        self.how = how

    @hookimpl
    def lightspec_propose(self, ctx):
        self.count()
        drafts = lookup_drafts(ctx)
        for seq in ctx.sequences:
            if isinstance(seq, list):
                if self.how == "append":
                    seq.append(3)
                else:
                    seq += [3]
        return proposal(ctx, drafts, self.name)


class ZeroProbs(_Faulty):
    """Uniformly sampled drafts whose reported probability at the proposed token is wrong."""

    name = "zero_probs"
    VALUES = {"zero": 0.0, "negative": -0.5, "nan": float("nan"), "tiny": 1e-30}

    def __init__(self, mode: str = "zero", max_draft: int = 2):
        _check("mode", mode, (*self.VALUES, "correct"))
        if not isinstance(max_draft, int) or isinstance(max_draft, bool) or max_draft < 1:
            raise ValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        self.mode, self.max_draft = mode, max_draft

    @hookimpl
    def lightspec_propose(self, ctx):
        import torch

        self.count()
        V = int(ctx.vocab_size)
        drafts = []
        for b in range(len(ctx.sequences)):
            k = min(self.max_draft, int(ctx.max_draft_list[b]))
            drafts.append(torch.randint(3, V, (k,), generator=ctx.generators[b]).tolist() if k > 0 else [])
        width = max((len(d) for d in drafts), default=0)
        if self.mode == "correct":
            probs = torch.full((len(drafts), max(width, 1), V), 1.0 / (V - 3))
            probs[:, :, :3] = 0.0
        else:
            probs = torch.full((len(drafts), max(width, 1), V), 1.0 / V)
            for b, d in enumerate(drafts):
                for j, t in enumerate(d):
                    probs[b, j, t] = self.VALUES[self.mode]
        return proposal(ctx, drafts, self.name, probs=probs)


class OutOfVocab(_Faulty):
    """Lookup drafts whose first token is outside ``0 .. V-1``."""

    name = "out_of_vocab"
    MODES = ("vocab", "huge", "negative")

    def __init__(self, mode: str = "vocab"):
        _check("mode", mode, self.MODES)
        self.mode = mode

    @hookimpl
    def lightspec_propose(self, ctx):
        self.count()
        V = int(ctx.vocab_size)
        bad = {"vocab": V, "huge": V + 1000, "negative": -1}[self.mode]
        drafts = [[bad] + d[1:] if d else ([bad] if ctx.max_draft_list[b] > 0 else [])
                  for b, d in enumerate(lookup_drafts(ctx))]
        return proposal(ctx, drafts, self.name)


@hookimpl
def lightspec_register_strategies(register):
    register("raises_midway", RaisesMidway, description="propose raises after a few calls (fault injection)",
             params={"after": "successful calls before it starts raising (3)"})
    register("float_ids", FloatIds, description="drafts as float32 token ids (fault injection)",
             params={"mode": "integral | fractional"})
    register("mutates_sequences", MutatesSequences, description="appends to ctx.sequences in place (fault injection)",
             params={"how": "append | iadd"})
    register("zero_probs", ZeroProbs, description="reports an impossible probability at the proposed token (fault injection)",
             params={"mode": "zero | negative | nan | tiny | correct", "max_draft": "most tokens per draft (2)"})
    register("out_of_vocab", OutOfVocab, description="drafts token ids outside the vocabulary (fault injection)",
             params={"mode": "vocab | huge | negative"})
