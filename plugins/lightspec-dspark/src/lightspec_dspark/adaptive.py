"""Adaptive verification for any drafter (the ``adaptive`` strategy): after the drafter proposes,
keep only the draft nodes that pay for their verification.

Per step, with ``S[b, j]`` the survival score of node j of row b (the probability that the node
and every node before it on its path are accepted) and ``c(w)`` the cost of a verify forward of
the batch's ``B`` rows ``w`` slots wide, the batch's budget is

    K* = argmax_k (B + sum of the k largest S) / (draft cost + c(1 + widest row after the top k))

and the nodes kept are the global top-K* by survival (ties: the earlier node first, so every row
keeps a prefix of its chain, or an ancestor-closed part of its tree).  This is vLLM's rule for
DSpark (its ``AdaptiveVerificationManager``), with the verify cost read at the width the padded
verify forward really has.  See ``docs/design/adaptive-verification.md``.

Survival: the drafter's own when it declares ``confidence_is_survival`` (DSpark's confidence
head); else, training-free, per node ``a = min(peak probability, 1 - sqrt(0.2 * entropy))``
(AdaEDL's entropy bound) multiplied along the path; for drafters without probabilities (n-gram)
``a`` is the acceptance rate observed at that depth (from the step statistics).

Costs: the verify cost table ``c(B, w)`` is timed on the running hardware the first time a batch
of ``B`` rows is seen (per power-of-two bucket of B) (a separate target runner, median of 3 forwards per width), then follows the
engine's measured verify forwards (exponential average); the draft cost is the wrapped drafter's
measured propose time.  Seeded requests must not depend on timings: there the costs come from the
drafter's ``draft_cost_hints`` and a roofline verify cost ``max(1, B * w / SATURATION_TOKENS)`` target
steps (a forward costs one step until it holds that many slots, then grows with them).
"""

from __future__ import annotations

import time

import torch

from lightspec_core import DraftProposal, InvalidValueError, SparseProbs, TargetRunner, get_registry, hookimpl

ENTROPY_GAMMA = 0.2  # AdaEDL's gamma
SATURATION_TOKENS = 64  # timing-free roofline: a forward of up to this many slots costs one target step
EMA = 0.2


def select_top_k(survival: torch.Tensor, valid: torch.Tensor, draft_cost: float, verify_cost) -> tuple[torch.Tensor, int]:
    """The selection rule.  ``survival [B, N]`` (non-increasing along each row's paths), ``valid [B, N]``
    bool (real nodes), ``draft_cost`` a number, ``verify_cost(width)`` the cost of a verify forward
    ``width`` slots wide (``1 + nodes``).  Returns ``(keep [B, N] bool, K*)``."""
    B, N = survival.shape
    flat = torch.where(valid, survival.float(), torch.full_like(survival, -1.0, dtype=torch.float32)).flatten()
    n_valid = int(valid.sum())
    # sort by survival, then by node index (ancestors and earlier chain nodes first)
    node = torch.arange(N).repeat(B)
    order = sorted(range(B * N), key=lambda i: (-float(flat[i]), int(node[i])))[:n_valid]
    counts = [0] * B
    best, best_k, total = B / (draft_cost + verify_cost(1)), 0, 0.0
    for k, i in enumerate(order, start=1):
        counts[i // N] += 1
        total += max(0.0, float(flat[i]))
        value = (B + total) / (draft_cost + verify_cost(1 + max(counts)))
        if value > best:
            best, best_k = value, k
    keep = torch.zeros(B * N, dtype=torch.bool)
    keep[torch.tensor(order[:best_k], dtype=torch.long)] = True
    return keep.view(B, N), best_k


def node_survival(proposal: DraftProposal, is_survival: bool, depth_rates: list[float]) -> torch.Tensor:
    """``[B, N]`` survival scores of a proposal's nodes (see the module docstring)."""
    B, N = proposal.tokens.shape
    conf = proposal.confidence
    if conf is not None and is_survival:
        return conf.detach().float().cpu()
    parents = proposal.parents.cpu() if proposal.parents is not None else torch.arange(-1, N - 1).expand(B, N)
    depth = torch.zeros(B, N, dtype=torch.long)
    for j in range(N):
        p = parents[:, j]
        depth[:, j] = torch.where(p >= 0, depth.gather(1, p.clamp(min=0)[:, None])[:, 0] + 1, torch.zeros_like(p))
    if conf is not None:
        a = conf.detach().float().cpu()
        if proposal.entropy is not None:
            bound = 1 - (ENTROPY_GAMMA * proposal.entropy.detach().float().cpu().clamp(min=0)).sqrt()
            a = torch.minimum(a, bound)
    else:
        rates = torch.tensor(depth_rates)
        a = rates[depth.clamp(max=len(depth_rates) - 1)]
    a = a.clamp(0.0, 1.0)
    out = torch.zeros(B, N)
    for j in range(N):  # multiply along the path (parents come first)
        p = parents[:, j]
        up = torch.where(p >= 0, out.gather(1, p.clamp(min=0)[:, None])[:, 0], torch.ones(B))
        out[:, j] = a[:, j] * up
    return out


def trim(proposal: DraftProposal, keep: torch.Tensor) -> DraftProposal:
    """The proposal with only the ``keep [B, N]`` nodes (a prefix per chain row; for trees the kept
    nodes, ancestor-closed, renumbered in their order)."""
    dev = proposal.tokens.device
    if proposal.parents is None:
        lengths = torch.minimum(keep.sum(-1).to(dev), proposal.lengths)
        k = max(1, int(lengths.max()))
        probs = proposal.probs
        if isinstance(probs, SparseProbs):
            probs = SparseProbs(ids=probs.ids[:, :k], probs=probs.probs[:, :k])
        elif probs is not None:
            probs = probs[:, :k]
        cut = lambda t: None if t is None else t[:, :k]  # noqa: E731
        return DraftProposal(tokens=proposal.tokens[:, :k], lengths=lengths, probs=probs,
                             confidence=cut(proposal.confidence), entropy=cut(proposal.entropy),
                             source=proposal.source, parents=None)
    B, N = proposal.tokens.shape
    idx = [torch.nonzero(keep[b, : int(proposal.lengths[b])]).flatten().tolist() for b in range(B)]
    k = max(1, max(len(i) for i in idx))
    sel = torch.tensor([i + [0] * (k - len(i)) for i in idx], dtype=torch.long, device=dev)
    new_of = torch.full((B, N), -1, dtype=torch.long)
    for b, i in enumerate(idx):
        new_of[b, i] = torch.arange(len(i))
    old_par = proposal.parents.cpu().gather(1, sel.cpu())
    parents = torch.where(old_par >= 0, new_of.gather(1, old_par.clamp(min=0)), old_par).to(dev)
    take = lambda t: None if t is None else t.gather(1, sel)  # noqa: E731
    probs = proposal.probs
    if isinstance(probs, SparseProbs):
        g = sel[..., None].expand(-1, -1, probs.ids.shape[-1])
        probs = SparseProbs(ids=probs.ids.gather(1, g), probs=probs.probs.gather(1, g))
    elif probs is not None:
        probs = probs.gather(1, sel[..., None].expand(-1, -1, probs.shape[-1]))
    return DraftProposal(tokens=proposal.tokens.gather(1, sel), lengths=torch.tensor([len(i) for i in idx], device=dev),
                         probs=probs, confidence=take(proposal.confidence), entropy=take(proposal.entropy),
                         source=proposal.source, parents=parents)


def bucket(rows: int) -> int:
    """The batch size whose cost table serves ``rows`` rows: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()


class VerifyCosts:
    """Verify-forward seconds per (rows, width), timed on the target at first use of a batch-size
    bucket (powers of two: a batch of 5 rows is priced as 8), then averaged with the engine's
    measured verify forwards."""

    def __init__(self, widths: int):
        self.widths = widths
        self.table: dict[int, list[float]] = {}

    @torch.inference_mode()
    def calibrate(self, target, rows: int, device, context: int = 32) -> list[float]:
        runner = TargetRunner(target)
        runner.start(batch=rows, capacity=context + 4 * (self.widths + 1))
        g = torch.Generator().manual_seed(0)
        vocab = target.get_output_embeddings().weight.shape[0]
        runner.prefill([torch.randint(3, vocab, (context,), generator=g).tolist() for _ in range(rows)])
        costs = []
        for w in range(1, self.widths + 2):
            times = []
            for _ in range(3):
                start = runner.lengths
                tokens = torch.randint(3, vocab, (rows, w), generator=g).to(device)
                t0 = time.perf_counter()
                out = runner.forward(tokens)
                out.argmax_at([b * w for b in range(rows)])
                times.append(time.perf_counter() - t0)
                runner.commit(start, [[] for _ in range(rows)])
            costs.append(sorted(times)[1])
        for i in range(1, len(costs)):  # a wider forward never costs less
            costs[i] = max(costs[i], costs[i - 1])
        self.table[rows] = costs
        return costs

    def cost(self, rows: int, width: int) -> float:
        t = self.table[bucket(rows)]
        return t[min(width, len(t)) - 1] * (1 + max(0, width - len(t)) / len(t))

    def observe(self, rows: int, width: int, seconds: float) -> None:
        t = self.table.get(bucket(rows))
        if t is not None and 1 <= width <= len(t) and seconds > 0:
            t[width - 1] = (1 - EMA) * t[width - 1] + EMA * seconds


class AdaptiveStrategy:
    """Wraps a drafter and trims its proposals by the adaptive-verification rule (module docstring)."""

    name = "adaptive"

    def __init__(self, drafter="dspark", options: dict | None = None, max_width: int = 16):
        if isinstance(drafter, dict):
            options = {**{k: v for k, v in drafter.items() if k != "type"}, **(options or {})}
            drafter = drafter.get("type")
        if not isinstance(drafter, str) or drafter == "adaptive":
            raise InvalidValueError(f"drafter={drafter!r} is invalid: name a drafting strategy (e.g. dspark, ngram, draft_model)")
        if options is not None and not isinstance(options, dict):
            raise InvalidValueError(f"options={options!r} is invalid: use a mapping of the drafter's options")
        self.inner = get_registry().create("strategy", drafter, **(options or {}))
        self.inner_name = drafter
        self.costs = VerifyCosts(max_width)
        self.draft_s: dict[int, float] = {}
        self.depth_rates = [0.6] * 32
        self.last_k: int | None = None

    def setup(self, env) -> None:
        if hasattr(self.inner, "setup"):
            self.inner.setup(env)
        self.hidden_layers = list(getattr(self.inner, "hidden_layers", []) or [])
        self.target, self.device = env.target, env.device

    def reset(self) -> None:
        if hasattr(self.inner, "reset"):
            self.inner.reset()

    def draft_cost_hints(self) -> dict[str, float]:
        return self.inner.draft_cost_hints() if hasattr(self.inner, "draft_cost_hints") else {}

    @hookimpl
    def lightspec_on_stats(self, event):
        inner = getattr(self.inner, "lightspec_on_stats", None)
        if inner is not None:
            inner(event=event)
        if getattr(event, "kind", None) != "step" or not event.row_ids:
            return
        rows = len(event.row_ids)
        vf = (event.stage_s or {}).get("verify_forward")
        if vf and event.verify_tokens:
            self.costs.observe(rows, max(1, round(event.verify_tokens / rows)), vf)
        for d, a in zip(event.levels, event.accepted):  # conditional acceptance per depth (a tree's levels)
            for j in range(min(d, len(self.depth_rates))):
                if j > a:
                    break
                self.depth_rates[j] = (1 - EMA / 4) * self.depth_rates[j] + EMA / 4 * float(j < a)

    @hookimpl
    def lightspec_propose(self, ctx):
        t0 = time.perf_counter()
        proposal = self.inner.lightspec_propose(ctx=ctx)
        elapsed = time.perf_counter() - t0
        if proposal is None or int(proposal.lengths.max()) == 0:
            return proposal
        B, N = proposal.tokens.shape
        self.draft_s[B] = elapsed if B not in self.draft_s else (1 - EMA) * self.draft_s[B] + EMA * elapsed
        survival = node_survival(proposal, bool(getattr(self.inner, "confidence_is_survival", False)), self.depth_rates)
        valid = torch.arange(N)[None, :] < proposal.lengths.cpu()[:, None]
        if ctx.deterministic:
            hint = sum(self.draft_cost_hints().values()) or 0.1
            draft_cost = hint * N * max(1.0, B / SATURATION_TOKENS)
            verify = lambda w: max(1.0, B * w / SATURATION_TOKENS)  # noqa: E731
        else:
            if bucket(B) not in self.costs.table:
                self.costs.calibrate(self.target, bucket(B), self.device)
            draft_cost, verify = self.draft_s[B], (lambda w: self.costs.cost(B, w))
        keep, self.last_k = select_top_k(survival, valid, draft_cost, verify)
        if self.last_k == 0:
            return None
        return trim(proposal, keep)

