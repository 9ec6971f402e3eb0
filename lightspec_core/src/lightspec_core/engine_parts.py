"""The engine's state and checks, so that ``Engine.step`` reads as the design's stages.

* ``Row`` / ``Batch``: the requests being decoded, their generators, stop rules and the
  target hidden states waiting for the strategy's next ``propose``;
* ``FailureLog``: failures of components, reported once with a count, with back-off;
* ``Profiler``: a step's stage times (one object, no timestamps in the step's logic).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from .interfaces import RowHistory, StepContext
from .sampling import SamplingParams

log = logging.getLogger("lightspec.engine")

HISTORY_DECAY = 0.9
MAX_PENDING_HIDDEN = 1024  # target states kept per row for a strategy that has not proposed for a while


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


@dataclass
class Row:
    """One request being decoded: its tokens (prompt + generated), limits and generators."""

    request: int
    tokens: list[int]
    prompt_len: int
    max_new: int
    stop: list[str]
    seed: int
    verify_gen: torch.Generator
    draft_gen: torch.Generator
    context: int | None = None  # the target's context length: the row stops there
    generated: int = 0
    finish_reason: str | None = None
    history: RowHistory = field(default_factory=RowHistory)

    def room(self) -> int:
        """Tokens this row may still emit (``max_new``, and the target's context length)."""
        left = self.max_new - self.generated
        return left if self.context is None else min(left, self.context - len(self.tokens))


class Batch:
    """The rows of one generation and the bookkeeping of the running batch."""

    def __init__(self, rows: list[Row], sampling: SamplingParams, deterministic: bool):
        self.rows = rows
        self.active = list(range(len(rows)))  # indices into rows of the rows still decoding
        self._active_rows = list(rows)
        self.sampling, self.deterministic = sampling, deterministic
        self.step = 0
        self.queue_backlog = 0  # requests waiting to join (a server sets it; reported in the step stats)
        self.limits: list[int] = []  # this step's draft limit per active row
        # target hidden states not yet handed to the strategy: (states {layer: [B, n, H]},
        # lengths [B], first positions [B]) per forward since its last propose
        self.pending: list[tuple[dict[int, torch.Tensor], list[int], list[int]]] = []

    @property
    def pending(self) -> list[tuple[dict[int, torch.Tensor], list[int], list[int]]]:
        return self._pending

    @pending.setter
    def pending(self, chunks: list[tuple[dict[int, torch.Tensor], list[int], list[int]]]) -> None:
        # the chunks' widest rows summed, kept up to date as chunks arrive: a strategy that
        # does not propose (a batch decoding plainly) collects one chunk per step, and a sum
        # over all of them at every step grew with the wait (docs/design/core-api.md)
        self._pending = chunks
        self._pending_width = sum(max(n, default=0) for _, n, _ in chunks)

    def active_rows(self) -> list[Row]:
        return self._active_rows

    def last_tokens(self) -> list[int]:
        return [r.tokens[-1] for r in self._active_rows]

    def seed_generators(self, stream: int | None) -> None:
        """Re-seed the active rows' generators from (request seed, current length): stream 0
        the verifier's only, None both."""
        for r in self._active_rows:
            n = len(r.tokens)
            r.verify_gen.manual_seed(position_seed(r.seed, n, 0))
            if stream is None:
                r.draft_gen.manual_seed(position_seed(r.seed, n, 1))

    def emit(self, row: Row, new: list[int], eos_ids: set[int], tokenizer) -> StepOutput:
        """Append ``new`` tokens to ``row`` up to the first stop; return what was kept."""
        kept = []
        for t in new:
            row.tokens.append(t)
            row.generated += 1
            kept.append(t)
            if t in eos_ids:
                row.finish_reason = "stop"
                break
            if row.stop and _hits_stop(row, tokenizer):
                row.finish_reason = "stop"
                break
            if row.generated >= row.max_new or (row.context is not None and len(row.tokens) >= row.context):
                row.finish_reason = "length"
                break
        return StepOutput(row.request, kept, row.finish_reason)

    def learn(self, depths: list[int] | None, accepted: list[int]) -> None:
        """Update each active row's acceptance history with this step's verify; ``depths``:
        each row's draft depth (a tree accepted to its depth counts no rejection), None
        without a draft."""
        for i, r in enumerate(self._active_rows):
            d = depths[i] if depths is not None else 0
            a = accepted[i]
            h = r.history
            h.accepted = h.accepted * HISTORY_DECAY + a
            h.rejected = h.rejected * HISTORY_DECAY + (1 if a < d else 0)
            h.drafted += d
            h.accepted_total += a
            h.steps += 1

    # -- target hidden states for the strategy ---------------------------------------------

    def add_hidden(self, out, slots: list[list[int]], first_positions: list[int]) -> None:
        """Keep the hidden states of the committed slots (``slots[b]`` of row b, whose first
        token is at sequence position ``first_positions[b]``) of the forward ``out``, for
        the strategy's next ``propose``.  Nothing is kept when no layer was captured."""
        if not out.captured:
            return
        M = max(len(s) for s in slots)
        if all(s == list(range(len(s))) for s in slots):  # prefixes (chains): a slice, no gather
            states = {i: h if h.shape[1] == M else h[:, :M] for i, h in out.captured.items()}
        else:
            index = torch.tensor([s + [0] * (M - len(s)) for s in slots], device=next(iter(out.captured.values())).device)
            states = {i: h.gather(1, index[:, :, None].expand(-1, -1, h.shape[-1])) for i, h in out.captured.items()}
        self._pending.append((states, [len(s) for s in slots], list(first_positions)))
        self._pending_width += M
        if self._pending_width > MAX_PENDING_HIDDEN:
            self.pending = [_join(self._pending, keep_last=MAX_PENDING_HIDDEN)]

    def hand_over_hidden(self, ctx: StepContext) -> None:
        """Put the pending states into ``ctx`` (``hidden_states``, ``hidden_positions``,
        ``hidden_lengths``)."""
        if not self.pending:
            return
        if len(self.pending) > 1:
            self.pending = [_join(self.pending)]
        states, lengths, positions = self.pending[0]
        dev = ctx.device
        ctx.hidden_states = states
        ctx.hidden_lengths = torch.tensor(lengths, dtype=torch.long, device=dev)
        ctx.hidden_positions = torch.tensor(positions, dtype=torch.long, device=dev)

    def hidden_seen(self) -> None:
        """The strategy has taken the pending states (its ``propose`` returned)."""
        self.pending = []

    def add_row(self, row: Row, out, prompt_len: int) -> None:
        """Admit ``row``, prefilled alone in ``out`` (a one-row ``TargetOutput``), after the
        active rows; its prompt's hidden states join the pending ones (continuous batching)."""
        self.rows.append(row)
        self.active.append(len(self.rows) - 1)
        self._active_rows = [self.rows[b] for b in self.active]
        if not out.captured:
            return
        mine = {i: h[:, :prompt_len] for i, h in out.captured.items()}
        if not self.pending:  # the others have no states waiting: theirs are empty
            n = len(self._active_rows) - 1
            ref = next(iter(mine.values()))
            self.pending = [({i: ref.new_zeros(n, 0, ref.shape[-1]) for i in mine}, [0] * n,
                             [len(r.tokens) - 1 for r in self._active_rows[:-1]])]
        states, lengths, positions = _join(self.pending) if len(self.pending) > 1 else self.pending[0]
        M = max(max(lengths, default=0), prompt_len)
        joined = {}
        for i, h in states.items():
            out_h = h.new_zeros(h.shape[0] + 1, M, h.shape[-1])
            out_h[: h.shape[0], : h.shape[1]] = h
            out_h[h.shape[0], :prompt_len] = mine[i][0]
            joined[i] = out_h
        self.pending = [(joined, lengths + [prompt_len], positions + [0])]

    def forget_finished(self) -> None:
        """Keep only the active rows in ``rows`` (a long-running batch must not keep every
        request it ever served)."""
        self.rows = list(self._active_rows)
        self.active = list(range(len(self.rows)))
        if not self.rows:
            self.pending = []

    def drop_finished(self) -> list[int] | None:
        """Drop finished rows; return the positions (in the old active list) of the rows
        kept, or None when none finished."""
        still = [i for i, b in enumerate(self.active) if self.rows[b].finish_reason is None]
        if len(still) == len(self.active):
            return None
        self.active = [self.active[i] for i in still]
        self._active_rows = [self.rows[b] for b in self.active]
        if self.pending and still:
            index = torch.tensor(still)
            self.pending = [({k: v.index_select(0, index.to(v.device)) for k, v in s.items()},
                             [n[i] for i in still], [p[i] for i in still]) for s, n, p in self.pending]
        return still if still else None


def _join(chunks, keep_last: int | None = None):
    """Several pending chunks as one: per row, the states of all chunks in order (the last
    ``keep_last`` per row at most)."""
    rows = len(chunks[0][1])
    layers = list(chunks[0][0])
    per_row = []
    for b in range(rows):
        parts = {i: torch.cat([s[i][b, : n[b]] for s, n, _ in chunks]) for i in layers}
        total = sum(n[b] for _, n, _ in chunks)
        start = chunks[0][2][b]
        if keep_last is not None and total > keep_last:
            parts = {i: t[-keep_last:] for i, t in parts.items()}
            start += total - keep_last
            total = keep_last
        per_row.append((parts, total, start))
    M = max(t for _, t, _ in per_row)
    states = {}
    for i in layers:
        ref = chunks[0][0][i]
        out = ref.new_zeros(rows, M, ref.shape[-1])
        for b, (parts, total, _) in enumerate(per_row):
            out[b, :total] = parts[i]
        states[i] = out
    return states, [t for _, t, _ in per_row], [s for _, _, s in per_row]


def length_groups(lengths: list[int], room: int) -> list[list[int]]:
    """Split a batch's rows (prompt ``lengths``) into groups decoded one after the other, so
    that padding never more than doubles a group's KV cache: every row of a group gets slabs
    as long as its longest prompt plus ``room`` columns.  Rows are taken longest first; a
    group takes the next row while ``rows × (longest + room) <= 2 × Σ(length + room)``.
    Prompts of similar lengths stay one group (one batch, as asked)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        if g is not None and (len(g) + 1) * (lengths[g[0]] + room) <= 2 * (sum(lengths[j] for j in g) + lengths[i]
                                                                            + (len(g) + 1) * room):
            g.append(i)
        else:
            groups.append([i])
    return [sorted(g) for g in sorted(groups, key=min)]


def _hits_stop(row: Row, tokenizer) -> bool:
    width = max(len(s) for s in row.stop) + 2
    tail = row.tokens[max(row.prompt_len, len(row.tokens) - width):]
    text = tokenizer.decode(tail, skip_special_tokens=True)
    return any(s in text for s in row.stop)


# -- failures and timing ---------------------------------------------------------------------


class FailureLog:
    """Failures of a generation's components, said once: each is logged at debug level when
    it happens and recorded in that step's statistics (``StepStats.failure``); when the
    generation ends, one warning per failing component gives the count and the first error.
    Consecutive drafting failures back off: after the n-th in a row, the next
    2^(n-1) - 1 steps (at most 63) decode plainly without asking the strategy.  A sink that
    raises backs off the same way (it misses those events)."""

    def __init__(self, strategy: str, sink_names: list[str]):
        self.strategy, self.sink_names = strategy, sink_names
        self.start()

    def start(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}
        self.streak = 0
        self.skip = 0
        self.last: tuple[int, str] | None = None
        self.sink_skip: dict[int, int] = {}
        self.sink_streak: dict[int, int] = {}

    def record(self, stage: str, exc: BaseException | str, step: int) -> None:
        msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        key = f"strategy {self.strategy!r} {stage}"
        self.counts[key] = self.counts.get(key, 0) + 1
        self.first.setdefault(key, msg)
        self.last = (step, f"{stage} failed: {msg}")
        log.debug("%s failed at step %d: %s; that step decodes plainly", key, step, msg)
        if stage in ("propose", "budget"):
            self.streak += 1
            self.skip = min(2 ** (self.streak - 1) - 1, 63)

    def succeeded(self, stage: str) -> None:
        if stage == "propose":
            self.streak = 0

    def backing_off(self) -> bool:
        """Whether this step skips drafting because the strategy keeps failing."""
        if self.skip > 0:
            self.skip -= 1
            return True
        return False

    def step_failure(self, step: int) -> str | None:
        return self.last[1] if self.last is not None and self.last[0] == step else None

    def record_sink(self, i: int, exc: BaseException) -> None:
        name = self.sink_names[i] if i < len(self.sink_names) else f"sink {i}"
        key = f"statistics sink {name}"
        self.counts[key] = self.counts.get(key, 0) + 1
        self.first.setdefault(key, f"{type(exc).__name__}: {exc}")
        log.debug("%s failed: %s: %s", key, type(exc).__name__, exc)
        n = self.sink_streak[i] = self.sink_streak.get(i, 0) + 1
        self.sink_skip[i] = min(2 ** (n - 1) - 1, 63)

    def sink_disabled(self, i: int) -> bool:
        left = self.sink_skip.get(i, 0)
        if left > 0:
            self.sink_skip[i] = left - 1
            return True
        return False

    def sink_succeeded(self, i: int) -> None:
        self.sink_streak.pop(i, None)

    def finish(self) -> None:
        """Say once per failing component what failed in this generation, how often."""
        for key, n in self.counts.items():
            then = "those steps decoded plainly" if key.startswith("strategy") else "it missed those events"
            log.warning("%s failed %d time%s in this generation (first: %s); %s, the output is the target's own",
                        key, n, "" if n == 1 else "s", self.first[key], then)


class Profiler:
    """A step's wall time by stage (``lap(name)`` closes the stage that started at the last
    lap), and its device time on CUDA."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.laps: dict[str, float] = {}

    def start(self) -> "Profiler":
        self.t0 = self.last = time.perf_counter()
        self.laps = {}
        if self.cuda:
            self.ev0, self.ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.ev0.record()
        return self

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self.last
        self.last = now

    def total(self) -> float:
        return self.last - self.t0 if self.laps else time.perf_counter() - self.t0

    def stages(self, head_s: float = 0.0) -> dict[str, float]:
        """The stage times; ``head_s``, the lm_head applied lazily during ``verify``, counts as
        the target's forward."""
        out = dict(self.laps)
        if head_s:
            out["verify_forward"] = out.get("verify_forward", 0.0) + head_s
            out["verify"] = max(0.0, out.get("verify", 0.0) - head_s)
        return out

    def device_seconds(self) -> float | None:
        if not self.cuda:
            return None
        self.ev1.record()
        self.ev1.synchronize()
        return self.ev0.elapsed_time(self.ev1) / 1000


__all__ = ["Batch", "FailureLog", "Profiler", "Row", "StepOutput", "length_groups", "position_seed"]
