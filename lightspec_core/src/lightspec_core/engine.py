"""The decode loop: input preparation → draft → verify → fuse, for a batch of ragged rows.

One step, for the B active rows:

1. budget: the policy says how many tokens each row may draft;
2. draft: the strategy proposes ``[B, K]`` tokens (ragged);
3. verify: one target forward over ``[newest token, drafts]``, then the verifier keeps a
   prefix of each row's draft plus one corrected/bonus token;
4. fuse the result back: roll each row's KV cache back to what it kept, append the
   emitted tokens, apply stop rules, drop finished rows, emit one statistics event.

The loop calls the strategy's bound methods directly (resolved once by the pipeline).
If the strategy raises in propose or verify, that step falls back to plain decoding
(the target's own next token) and the failure is reported.
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .interfaces import Budget, DraftProposal, RowHistory, StepContext, VerifyResult
from .kvcache import BatchedKV, takes_logits_to_keep
from .lean_decoder import exact_lean_target
from .model_parts import HiddenCapture
from .sampling import SamplingParams, make_generator
from .stats import StepStats
from .verify import StandardVerifier, greedy_cpu_lazy, sample_next

log = logging.getLogger("lightspec.engine")

HISTORY_DECAY = 0.9


@dataclass
class BoundStrategy:
    """A strategy resolved to plain callables (no hook dispatch in the loop)."""

    name: str
    propose: Callable[..., DraftProposal | None] | None
    verify: Callable[..., VerifyResult]
    budget: Callable[..., Budget]
    sinks: list[Callable[..., None]]
    components: list[Any]
    hidden_layers: list[int] = field(default_factory=list)


@dataclass
class RowState:
    request: int
    tokens: list[int]  # prompt + generated
    prompt_len: int
    max_new: int
    stop: list[str]
    generated: int = 0
    finish_reason: str | None = None


@dataclass
class StepOutput:
    """What one step emitted for one request."""

    request: int
    tokens: list[int]
    finish_reason: str | None


def position_seed(base: int, position: int, stream: int) -> int:
    """A 63-bit seed for (request seed, sequence position, stream): 0 verify, 1 draft."""
    x = (base * 6364136223846793005 + position * 1442695040888963407 + stream * 0x9E3779B97F4A7C15) % (1 << 64)
    x ^= x >> 31
    return x % (1 << 63)


class Engine:
    def __init__(self, target, tokenizer, bound: BoundStrategy, device: torch.device, lean_target: bool = True):
        self.target = target
        # The target's forwards go through an exact lean forward when one reproduces the HF
        # forward bit for bit (lean_decoder.exact_lean_target); otherwise through HF's.
        lean = exact_lean_target(target) if lean_target else None
        self.runner = lean if lean is not None else target
        self.target_forward = "lean" if lean is not None else "hf"
        # greedy verification by the built-in verifier on the CPU: the lm_head only over the
        # positions the walk reaches (verify.greedy_cpu_lazy), from the lean forward's hidden states
        verifier = bound.components[1] if len(bound.components) > 1 else None
        self.lazy_head = lean is not None and type(verifier) is StandardVerifier and torch.device(device).type == "cpu"
        self.keeps_logits = takes_logits_to_keep(self.runner)
        self.tokenizer = tokenizer
        self.bound = bound
        self.device = torch.device(device)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.capture = None
        if bound.hidden_layers:
            self.capture = lean.capture(bound.hidden_layers) if lean is not None else HiddenCapture(target, bound.hidden_layers)

    # ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        seeds: list[int | None],
        stop: list[str],
        eos_ids: set[int],
        on_prefill: Callable[[int, float], None] | None = None,
    ) -> Iterator[list[StepOutput]]:
        """Generate for ``prompts`` (token id lists); yields each step's outputs."""
        dev = self.device
        B = len(prompts)
        for comp in self.bound.components:
            if hasattr(comp, "reset"):
                comp.reset()
        rows = [RowState(i, list(p), len(p), m, stop) for i, (p, m) in enumerate(zip(prompts, max_new_tokens))]
        # Randomness is keyed by (request seed, sequence position): before each step every
        # row's generators are re-seeded from its seed and its current length, so a seeded
        # request's output does not depend on what else shares its batch.
        base = [s if s is not None else int(torch.randint(0, 2**62, (1,))) for s in seeds]
        verify_gens = [make_generator(0, dev) for _ in seeds]
        draft_gens = [make_generator(0, dev) for _ in seeds]
        deterministic = all(s is not None for s in seeds) and not sampling.greedy
        history = [RowHistory() for _ in range(B)]
        lens = [len(p) for p in prompts]
        longest = max(lens)
        kv = BatchedKV(self.runner, B, dev, capacity=longest + max(max_new_tokens) + 32)

        # -- prefill: right-padded, so padding never precedes a real token ---------------
        t0 = time.perf_counter()
        ids = torch.zeros(B, longest, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p)
        valid = None
        if min(lens) != longest:
            valid = torch.arange(longest)[None, :] < torch.tensor(lens)[:, None]
            valid = valid.to(dev)
        # logits only from the shortest row's last position on, as HF generate's prefill does
        # (logits_to_keep): the lm_head over a whole prompt is a large, useless matmul
        keep = longest - min(lens) + 1 if self.keeps_logits else longest
        extra = {"logits_to_keep": keep} if self.keeps_logits else {}
        out = kv.forward(ids.to(dev), valid, **extra)
        last = torch.tensor(lens, device=dev) - 1 - (longest - keep)
        logits = out.logits[torch.arange(B, device=dev), last]
        if not sampling.greedy:
            for b, r in enumerate(rows):
                verify_gens[b].manual_seed(position_seed(base[b], len(r.tokens), 0))
        first = sample_next(logits, sampling, verify_gens).tolist()
        hidden = dict(self.capture.states) if self.capture else {}
        hidden_valid = torch.tensor(lens, device=dev)
        del out, logits
        prefill_s = time.perf_counter() - t0
        if on_prefill:
            on_prefill(B, prefill_s)
        outputs = [self._emit(r, [t], eos_ids) for r, t in zip(rows, first)]
        yield outputs

        active = [b for b, r in enumerate(rows) if r.finish_reason is None]
        if active and len(active) < B:
            keep = torch.tensor(active, device=dev)
            kv.select_rows(keep)
            hidden = {k: v.index_select(0, keep) for k, v in hidden.items()}
            hidden_valid = hidden_valid.index_select(0, keep)
        step = 0
        cuda = dev.type == "cuda"
        while active:
            step += 1
            t_step = time.perf_counter()
            if cuda:
                ev0 = torch.cuda.Event(enable_timing=True)
                ev1 = torch.cuda.Event(enable_timing=True)
                ev0.record()
            act_rows = [rows[b] for b in active]
            nb = len(active)
            if not sampling.greedy:
                for b in active:
                    n = len(rows[b].tokens)
                    verify_gens[b].manual_seed(position_seed(base[b], n, 0))
                    draft_gens[b].manual_seed(position_seed(base[b], n, 1))
            ctx = StepContext(
                step=step,
                sequences=[r.tokens for r in act_rows],
                row_ids=[r.request for r in act_rows],
                max_draft=None,  # set below
                max_draft_list=[],
                min_confidence=None,
                sampling=sampling,
                generators=[draft_gens[b] for b in active],
                history=[history[b] for b in active],
                target=self.target,
                tokenizer=self.tokenizer,
                device=dev,
                vocab_size=self.vocab_size,
                hidden_states=hidden,
                hidden_positions=hidden_valid,
                deterministic=deterministic,
                extras={"target_kv": kv},
                draft_cost_hints=self._cost_hints(),
            )
            # 1. budget (never draft past a row's max_new_tokens)
            failure = None
            proposal = None
            t_a = time.perf_counter()
            if self.bound.propose is not None:
                try:
                    budget = self.bound.budget(ctx=ctx)
                    room = [r.max_new - r.generated - 1 for r in act_rows]
                    wanted = budget.max_draft.tolist()
                    limits = [max(0, min(k, m)) for k, m in zip(wanted, room)]
                    # the budget's own tensor when no row is cut (a tensor made right after a
                    # forward costs several microseconds)
                    ctx.max_draft = budget.max_draft if limits == wanted else torch.tensor(limits, device=dev)
                    ctx.max_draft_list = limits
                    ctx.min_confidence = budget.min_confidence
                    ctx.budget_by_source = budget.by_source
                    allowed = limits
                    if budget.free_max_draft is not None:  # model-free drafters may go further
                        allowed = [max(k, min(f, m)) for k, f, m in zip(limits, budget.free_max_draft, room)]
                        ctx.free_max_draft_list = allowed
                    t_b = time.perf_counter()
                    # 2. draft
                    if max(limits) > 0:
                        proposal = self.bound.propose(ctx=ctx)
                        if proposal is not None:
                            proposal, draft_lens, draft_rows = self._check_proposal(proposal, nb, allowed)
                except Exception as exc:  # the step falls back to plain decoding
                    failure = f"propose failed: {type(exc).__name__}: {exc}"
                    log.warning("strategy %r %s; falling back to plain decoding for this step", self.bound.name, failure)
                    proposal = None
            else:
                t_b = t_a
            t_c = time.perf_counter()
            if proposal is not None and proposal.max_len == 0:
                proposal = None
            # the verify's input from Python lists: one tensor each (a few tensor ops per step
            # are several percent of a 2 ms step, and they run on caches the forward evicted)
            last = [r.tokens[-1] for r in act_rows]
            if proposal is None:
                inp = torch.tensor(last, device=dev)[:, None]
                inp_valid = None
                K = 0
            else:
                K = proposal.max_len
                inp = torch.tensor([[t] + row for t, row in zip(last, draft_rows)], device=dev)
                inp_valid = None
                if any(n < K for n in draft_lens):
                    inp_valid = torch.tensor([[j <= n for j in range(K + 1)] for n in draft_lens], device=dev)
            # 3. verify forward
            npos_before = kv.npos.tolist()
            # greedy on the CPU's lean forward: the lm_head applied afterwards, only as far as
            # the verify walk goes, and with the argmax fused into it (a plain step too)
            lazy = sampling.greedy and self.lazy_head
            out = kv.forward(inp, inp_valid, head=False) if lazy else kv.forward(inp, inp_valid)
            logits = out.logits
            t_d = time.perf_counter()
            head_s = [0.0]  # the lm_head's time in a lazy verify: the target's forward, not overhead
            verified = None  # the lazy verify's (accepted, emitted) as Python lists
            if lazy:  # the built-in greedy verify, the lm_head applied as far as the walk goes
                def timed(fn, head_s=head_s):
                    def run(x):
                        t = time.perf_counter()
                        y = fn(x)
                        head_s[0] += time.perf_counter() - t
                        return y
                    return run

                head, head_argmax = timed(self.runner._head), timed(self.runner._head_argmax)
                if proposal is None:
                    verified = ([0] * nb, head_argmax(out.hidden[:, 0]).view(nb, 1).tolist())
                else:
                    try:
                        verified = greedy_cpu_lazy(draft_rows, draft_lens, out.hidden, head, as_lists=True,
                                                   head_argmax=head_argmax)
                    except Exception as exc:
                        failure = f"verify failed: {type(exc).__name__}: {exc}"
                        log.warning("strategy %r %s; falling back to plain decoding for this step", self.bound.name, failure)
                        verified = ([0] * nb, head_argmax(out.hidden[:, 0]).view(nb, 1).tolist())
            elif proposal is None:
                nxt = sample_next(logits[:, 0], sampling, [verify_gens[b] for b in active])
                result = VerifyResult(torch.zeros(nb, dtype=torch.long, device=dev), nxt[:, None])
            else:
                vctx = ctx
                vctx.generators = [verify_gens[b] for b in active]
                try:
                    result = self.bound.verify(ctx=vctx, proposal=proposal, logits=logits)
                except Exception as exc:
                    failure = f"verify failed: {type(exc).__name__}: {exc}"
                    log.warning("strategy %r %s; falling back to plain decoding for this step", self.bound.name, failure)
                    nxt = sample_next(logits[:, 0], sampling, vctx.generators)
                    result = VerifyResult(torch.zeros(nb, dtype=torch.long, device=dev), nxt[:, None])
                ctx.generators = [draft_gens[b] for b in active]
            t_e = time.perf_counter()
            # 4. roll back rejected slots, append what was emitted
            if verified is not None:
                accepted, emitted_rows = verified
            else:
                accepted, emitted_rows = result.accepted.tolist(), result.emitted.tolist()
            kv.truncate([n + 1 + a for n, a in zip(npos_before, accepted)])
            outputs = []
            drafted = list(draft_lens) if proposal is not None else [0] * nb
            emitted_counts = []
            for i, b in enumerate(active):
                a = accepted[i]
                new = emitted_rows[i][: a + 1]
                o = self._emit(rows[b], new, eos_ids)
                outputs.append(o)
                emitted_counts.append(len(o.tokens))
                h = history[b]
                h.accepted = h.accepted * HISTORY_DECAY + a
                h.rejected = h.rejected * HISTORY_DECAY + (1 if a < drafted[i] else 0)
                h.drafted += drafted[i]
                h.accepted_total += a
                h.steps += 1
            if self.capture:
                hidden = dict(self.capture.states)
                hidden_valid = torch.tensor([a + 1 for a in accepted], device=dev)
            t_f = time.perf_counter()
            # statistics
            step_s = t_f - t_step
            dev_s = None
            if cuda:
                ev1.record()
                ev1.synchronize()
                dev_s = ev0.elapsed_time(ev1) / 1000
            peak = torch.cuda.max_memory_allocated(dev) if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            conf = ent = [None] * nb
            if proposal is not None and proposal.confidence is not None:
                conf = proposal.confidence[:, 0].tolist()
            if proposal is not None and proposal.entropy is not None:
                ent = proposal.entropy[:, 0].tolist()
            fwd_s = t_d - t_c + head_s[0]
            event = StepStats(
                kind="step",
                step=step,
                row_ids=ctx.row_ids,
                step_time_s=step_s,
                device_time_s=dev_s,
                peak_memory_bytes=peak,
                drafted=drafted,
                accepted=accepted if proposal is not None else [0] * nb,
                emitted=emitted_counts,
                sources=[proposal.source_of(i) if proposal is not None and drafted[i] else "" for i in range(nb)],
                confidence=conf,
                entropy=ent,
                stage_s={
                    "budget": t_b - t_a,
                    "draft": t_c - t_b,
                    "verify_forward": fwd_s,
                    "accept": t_e - t_d - head_s[0],
                    "update": t_f - t_e,
                },
                target_forward_s=fwd_s,
                draft_forward_s=ctx.timer.model_s,
                draft_setup_s=ctx.timer.setup_s,
                draft_by_source=dict(ctx.timer.by_source),
                overhead_s=max(0.0, step_s - fwd_s - ctx.timer.model_s),
                verify_tokens=K + 1,
                failure=failure,
            )
            for sink in self.bound.sinks:
                sink(event=event)
            yield outputs
            # drop finished rows from the batch
            still = [b for b in active if rows[b].finish_reason is None]
            if still and len(still) < len(active):
                pos = {b: i for i, b in enumerate(active)}
                keep = torch.tensor([pos[b] for b in still], device=dev)
                kv.select_rows(keep)
                if self.capture:
                    hidden = {k: v.index_select(0, keep) for k, v in hidden.items()}
                    hidden_valid = hidden_valid.index_select(0, keep)
            active = still

    def _cost_hints(self) -> dict[str, float]:
        strategy = self.bound.components[0] if self.bound.components else None
        hints = getattr(strategy, "draft_cost_hints", None)
        return hints() if callable(hints) else {}

    def _check_proposal(self, p: DraftProposal, batch: int, limits: list[int]) -> tuple[DraftProposal, list[int], list[list[int]]]:
        """Validate a proposal; return it with its padding (beyond each row's length) zeroed,
        and its lengths and token rows (padding zeroed) as Python lists."""
        if p.tokens.shape[0] != batch:
            raise ValueError(f"proposal has {p.tokens.shape[0]} rows, the batch has {batch}")
        if p.max_len == 0:
            return p, [0] * batch, [[] for _ in range(batch)]
        # on Python lists: one device sync instead of a handful of tensor ops per step
        lens, rows = p.lengths.tolist(), p.tokens.tolist()
        padded = False
        for b, (n, m, row) in enumerate(zip(lens, limits, rows)):
            if n < 0 or n > m or n > p.max_len:
                raise ValueError(f"proposal row {b} has length {n}, allowed 0..{min(m, p.max_len)}")
            if any(t < 0 or t >= self.vocab_size for t in row[:n]):
                raise ValueError(f"proposal has token ids outside [0, {self.vocab_size})")
            padded = padded or any(row[n:])
        if padded:  # zero what lies beyond each row's length
            real = torch.arange(p.max_len, device=p.tokens.device)[None, :] < p.lengths[:, None]
            p.tokens = torch.where(real, p.tokens, 0)
            rows = [row[:n] + [0] * (p.max_len - n) for n, row in zip(lens, rows)]
        if p.probs is not None and p.probs.shape[-1] != self.vocab_size:
            raise ValueError(f"proposal probs have vocabulary {p.probs.shape[-1]}, the target has {self.vocab_size}")
        return p, lens, rows

    def _emit(self, row: RowState, new: list[int], eos_ids: set[int]) -> StepOutput:
        """Append ``new`` tokens to ``row`` up to the first stop; return what was kept."""
        kept = []
        for t in new:
            row.tokens.append(t)
            row.generated += 1
            kept.append(t)
            if t in eos_ids:
                row.finish_reason = "stop"
                break
            if row.stop and self._hits_stop(row):
                row.finish_reason = "stop"
                break
            if row.generated >= row.max_new:
                row.finish_reason = "length"
                break
        return StepOutput(row.request, kept, row.finish_reason)

    def _hits_stop(self, row: RowState) -> bool:
        width = max(len(s) for s in row.stop) + 2
        tail = row.tokens[max(row.prompt_len, len(row.tokens) - width) :]
        text = self.tokenizer.decode(tail, skip_special_tokens=True)
        return any(s in text for s in row.stop)
