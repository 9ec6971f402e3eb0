"""The decode loop for a batch of ragged rows: one ``Engine.step`` per target forward.

A step, for the B active rows, in the design's four stages:

1. input preparation: the step's ``StepContext``, and the budget policy's draft limits;
2. drafting: the strategy's ``propose`` (a combination fuses its components' drafts there);
3. verification: one target forward over ``[last token, draft nodes]`` (``TargetRunner``),
   then the verifier's ``verify``;
4. fuse/rollback (``commit``): keep the accepted nodes' KV slots, append the emitted tokens,
   apply stop rules; then one statistics event.

The strategy's hooks were resolved to plain callables once (``BoundStrategy``); the step
calls them directly.  Whatever a component does wrong (raises, proposes garbage, returns a
malformed result), that step decodes plainly (``fallback``) and the failure is reported
(``FailureLog``): the output stays the target's own.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .contracts import check_proposal, check_result
from .engine_parts import Batch, FailureLog, Profiler, Row, StepOutput
from .errors import InvalidValueError
from .interfaces import Budget, DraftProposal, StepContext, VerifyResult
from .limits import context_length
from .runner import TargetOutput, TargetRunner
from .sampling import SamplingParams, make_generator
from .stats import StepStats
from .verify import sample_next

log = logging.getLogger("lightspec.engine")

__all__ = ["BoundStrategy", "Engine", "StepOutput"]


@dataclass
class BoundStrategy:
    """A pipeline's components resolved to plain callables (no hook dispatch in the loop).

    ``sinks``: every ``lightspec_on_stats``; ``resets``: every component's ``reset`` (called
    at the start of each generation); ``draft_cost_hints``: the strategy's, or None."""

    name: str
    propose: Callable[..., DraftProposal | None] | None
    verify: Callable[..., VerifyResult]
    budget: Callable[..., Budget]
    sinks: list[Callable[..., None]]
    resets: list[Callable[[], None]] = field(default_factory=list)
    hidden_layers: list[int] = field(default_factory=list)
    draft_cost_hints: Callable[[], dict[str, float]] | None = None
    sink_names: list[str] = field(default_factory=list)


class Engine:
    def __init__(self, target, tokenizer, bound: BoundStrategy, device: torch.device, lean_target: bool = True):
        self.target, self.tokenizer, self.bound = target, tokenizer, bound
        self.device = torch.device(device)
        # the target behind one interface: exact lean forward or HF's, lazy lm_head, hidden states
        self.runner = TargetRunner(target, bound.hidden_layers, lean=lean_target)
        self.target_forward = self.runner.forward_kind
        self.vocab_size = self.runner.vocab_size
        self.failures = FailureLog(bound.name, bound.sink_names or [f"sink {i}" for i in range(len(bound.sinks))])
        self.profiler = Profiler(self.device)

    # ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, prompts: list[list[int]], max_new_tokens: list[int], sampling: SamplingParams,
            seeds: list[int | None], stop: list[str], eos_ids: set[int],
            on_prefill: Callable[[int, float], None] | None = None,
            requests: list[int] | None = None) -> Iterator[list[StepOutput]]:
        """Generate for ``prompts`` (token id lists) as one batch; yields each step's outputs
        (the first from the prefill), until every row has finished.  ``requests``: the request
        index of each prompt (default 0, 1, ...), as ``StepOutput.request`` and in the stats."""
        for reset in self.bound.resets:
            reset()
        self.failures.start()
        try:
            yield from self._generate(prompts, max_new_tokens, sampling, seeds, stop, eos_ids, on_prefill,
                                      requests or list(range(len(prompts))))
        finally:  # also when the caller stops early (a closed stream)
            self.failures.finish()

    def _generate(self, prompts, max_new_tokens, sampling, seeds, stop, eos_ids, on_prefill, requests):
        context = context_length(self.target)
        if context is not None and max(map(len, prompts)) > context:
            raise InvalidValueError(f"a prompt has {max(map(len, prompts))} tokens; this model's context is {context} "
                                    f"tokens: shorten it")
        rows = [Row(i, list(p), len(p), m, stop, s if s is not None else int(torch.randint(0, 2**62, (1,))),
                    make_generator(0, self.device), make_generator(0, self.device), context=context)
                for i, p, m, s in zip(requests, prompts, max_new_tokens, seeds)]
        batch = Batch(rows, sampling, deterministic=all(s is not None for s in seeds) and not sampling.greedy)
        # the cache grows on demand: start with room for the prompts and a first stretch of output
        longest = max(map(len, prompts))
        room = min(max(max_new_tokens), 256, (context - longest) if context is not None else 256)
        self.runner.start(len(rows), capacity=longest + room + 32)
        prof = self.profiler.start()
        out = self.runner.prefill(prompts)
        batch.seed_generators(stream=0)
        P = out.slots
        last = [b * P + len(p) - 1 for b, p in enumerate(prompts)]
        if sampling.greedy:
            first = out.argmax_at(last)
        else:
            first = sample_next(out.logits_at(last), sampling, [r.verify_gen for r in rows]).tolist()
        batch.add_hidden(out, [list(range(len(p))) for p in prompts], [0] * len(rows))
        if on_prefill:
            on_prefill(len(rows), prof.total())
        yield [batch.emit(r, [t], eos_ids, self.tokenizer) for r, t in zip(rows, first)]
        self._drop_finished(batch)
        while batch.active:
            yield self.step(batch, eos_ids)
            self._drop_finished(batch)

    def step(self, batch: Batch, eos_ids: set[int]) -> list[StepOutput]:
        """One decode step for the batch's active rows: prepare → budget → draft → verify
        forward → verify → commit → statistics."""
        prof = self.profiler.start()
        # 1. input preparation
        ctx = self._prepare(batch)
        budget = self._budget(ctx, batch)  # None: no policy asked (no drafter, backing off, or it failed)
        prof.lap("budget")
        # 2. drafting (a combination strategy fuses its components' drafts inside propose)
        proposal = self._propose(ctx, batch) if budget is not None and max(batch.limits) > 0 else None
        prof.lap("draft")
        # 3. verification: one target forward over [last token, draft nodes], then the verifier
        start = self.runner.lengths
        nodes = proposal.node_rows() if proposal is not None else None
        parents = proposal.parent_rows() if proposal is not None else None
        out = self.runner.verify_forward(batch.last_tokens(), proposal, nodes, parents)
        prof.lap("verify_forward")
        accepted, emitted, paths = self._verify(ctx, batch, proposal, out)
        prof.lap("verify")
        # 4. fuse/rollback: keep the accepted slots' KV, append the emitted tokens
        depths = proposal.depth_rows() if proposal is not None else None
        outputs = self._commit(batch, start, depths, accepted, emitted, paths, out, eos_ids)
        prof.lap("commit")
        self._record(ctx, batch, budget, proposal, depths, accepted, outputs, out, prof)
        return outputs

    # -- the stages ------------------------------------------------------------------------

    def _prepare(self, batch: Batch) -> StepContext:
        """The step's context, per-row generators re-seeded from (request seed, position) so a
        seeded request does not depend on its batch.  The rows' read-only sequences are added
        when a budget policy is asked (``_budget``): a plain strategy never pays for them."""
        batch.step += 1
        rows = batch.active_rows()
        if not batch.sampling.greedy:
            batch.seed_generators(stream=None)
        return StepContext(
            step=batch.step, sequences=(), row_ids=[r.request for r in rows],
            prompt_lengths=[r.prompt_len for r in rows],
            sampling=batch.sampling, generators=[r.draft_gen for r in rows], history=[r.history for r in rows],
            target=self.target, tokenizer=self.tokenizer, device=self.device, vocab_size=self.vocab_size,
            runner=self.runner, deterministic=batch.deterministic,
            draft_cost_hints=self.bound.draft_cost_hints() if self.bound.draft_cost_hints else {})

    def _budget(self, ctx: StepContext, batch: Batch) -> Budget | None:
        """Ask the policy how much to draft; cap each row by what it may still emit.  Sets the
        context's budget fields and ``batch.limits``; None when the policy was not asked or failed."""
        if self.bound.propose is None or self.failures.backing_off():
            return None
        ctx.sequences = tuple(tuple(r.tokens) for r in batch.active_rows())
        try:
            budget = self.bound.budget(ctx=ctx)
        except Exception as exc:
            self.failures.record("budget", exc, ctx.step)
            return None
        room = [r.room() - 1 for r in batch.active_rows()]
        wanted = budget.max_draft.tolist()
        limits = [max(0, min(k, m)) for k, m in zip(wanted, room)]
        # the budget's own tensor when no row is cut (a new tensor costs several microseconds)
        ctx.max_draft = budget.max_draft if limits == wanted else torch.tensor(limits, device=self.device)
        ctx.max_draft_list, ctx.min_confidence, ctx.budget_by_source = limits, budget.min_confidence, budget.by_source
        if budget.free_max_draft is not None:  # model-free drafters may go further
            ctx.free_max_draft_list = [max(k, min(f, m)) for k, f, m in zip(limits, budget.free_max_draft, room)]
        batch.limits = ctx.free_max_draft_list or limits
        return budget

    def _propose(self, ctx: StepContext, batch: Batch) -> DraftProposal | None:
        """The strategy's draft, checked against the contract (``check_proposal``); None on
        no draft or on a failure (that step decodes plainly).  Rows whose sampling
        probabilities cannot be trusted are dropped from the draft and reported."""
        batch.hand_over_hidden(ctx)
        try:
            proposal = self.bound.propose(ctx=ctx)
            batch.hidden_seen()
            if proposal is None:
                return None
            proposal, problems = check_proposal(proposal, batch.limits, self.vocab_size, ctx.sampling, self.runner)
        except Exception as exc:
            self.failures.record("propose", exc, ctx.step)
            return None
        if problems:
            self.failures.record("propose", "; ".join(problems), ctx.step)
        else:
            self.failures.succeeded("propose")
        return proposal if proposal.max_len > 0 and any(proposal.node_rows()) else None

    def _verify(self, ctx: StepContext, batch: Batch, proposal: DraftProposal | None, out: TargetOutput):
        """(accepted [B], emitted [B][accepted + 1], kept node paths or None) from the verifier,
        or from a plain step when there is no draft or the verifier failed."""
        ctx.generators = [r.verify_gen for r in batch.active_rows()]
        if proposal is not None:
            try:
                result = check_result(self.bound.verify(ctx=ctx, proposal=proposal, output=out), proposal, self.vocab_size)
                self.failures.succeeded("verify")
                return result
            except Exception as exc:
                self.failures.record("verify", exc, ctx.step)
        return self.fallback(ctx, out)

    def fallback(self, ctx: StepContext, out: TargetOutput):
        """A plain step's result from the verify forward's slot 0: the target's own next token."""
        B, Q = out.batch, out.slots
        first = [b * Q for b in range(B)]
        if ctx.sampling.greedy:
            nxt = out.argmax_at(first)
        else:
            nxt = sample_next(out.logits_at(first), ctx.sampling, ctx.generators).tolist()
        return [0] * B, [[t] for t in nxt], None

    def _commit(self, batch: Batch, start: list[int], depths: list[int] | None, accepted: list[int],
                emitted: list[list[int]], paths: list[list[int]] | None, out: TargetOutput,
                eos_ids: set[int]) -> list[StepOutput]:
        """Keep each row's last token and accepted nodes in the target's KV cache (a chain: a
        truncation; a tree: its path compacted), append the emitted tokens (stop rules
        apply), keep the committed slots' hidden states for the strategy, learn acceptance
        (``depths``: each row's draft depth, None without a draft)."""
        if paths is None:
            slots = [list(range(a + 1)) for a in accepted]
        else:
            slots = [[0] + [1 + i for i in path] for path in paths]
        self.runner.commit(start, slots)
        rows = batch.active_rows()
        firsts = [len(r.tokens) - 1 for r in rows]  # the sequence position of each row's slot 0
        outputs = [batch.emit(r, e, eos_ids, self.tokenizer) for r, e in zip(rows, emitted)]
        batch.add_hidden(out, slots, firsts)
        batch.learn(depths, accepted)
        return outputs

    def _record(self, ctx, batch, budget, proposal, depths, accepted, outputs, out, prof) -> None:
        """One ``StepStats`` event to every sink (sinks are isolated: see ``emit``)."""
        B = len(outputs)
        drafted = [len(n) for n in proposal.node_rows()] if proposal is not None else [0] * B
        conf = ent = [None] * B
        if proposal is not None and proposal.confidence is not None:
            conf = proposal.confidence[:, 0].tolist()
        if proposal is not None and proposal.entropy is not None:
            ent = proposal.entropy[:, 0].tolist()
        stages = prof.stages(head_s=out.head_s)
        step_s = prof.total()
        fwd_s = stages["verify_forward"]
        busy = fwd_s + ctx.timer.model_s
        dev_s = prof.device_seconds()
        self.emit(StepStats(
            kind="step", step=ctx.step, row_ids=ctx.row_ids, step_time_s=step_s, device_time_s=dev_s,
            peak_memory_bytes=_peak_memory(self.device), drafted=drafted,
            accepted=accepted if proposal is not None else [0] * B, emitted=[len(o.tokens) for o in outputs],
            sources=[proposal.source_of(i) if proposal is not None and drafted[i] else "" for i in range(B)],
            confidence=conf, entropy=ent, stage_s=stages, target_forward_s=fwd_s,
            draft_forward_s=ctx.timer.model_s, draft_setup_s=ctx.timer.setup_s, draft_by_source=dict(ctx.timer.by_source),
            overhead_s=max(0.0, step_s - busy), verify_tokens=out.slots, failure=self.failures.step_failure(ctx.step),
            queue_backlog=batch.queue_backlog,
            budget_k=list(ctx.max_draft_list) if budget is not None else [0] * B,
            budget_reason=budget.reason if budget is not None else "plain",
            budget_estimates=dict(budget.estimates) if budget is not None else {},
            bubble_ratio=max(0.0, step_s - busy) / step_s if step_s > 0 else 0.0,
            depth=depths if depths is not None else [0] * B))

    def emit(self, event: Any) -> None:
        """Hand one statistics event to every sink; a sink that raises is reported once and
        does not stop the others or the generation."""
        for i, sink in enumerate(self.bound.sinks):
            if self.failures.sink_disabled(i):
                continue
            try:
                sink(event=event)
            except Exception as exc:
                self.failures.record_sink(i, exc)
            else:
                self.failures.sink_succeeded(i)

    def _drop_finished(self, batch: Batch) -> None:
        keep = batch.drop_finished()
        if keep is not None:
            self.runner.select_rows(torch.tensor(keep, device=self.device))


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
