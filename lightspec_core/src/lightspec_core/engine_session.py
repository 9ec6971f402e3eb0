"""A running batch that requests join and leave between steps (continuous batching).

    session = EngineSession(engine, sampling, eos_ids)
    first = session.add(request, prompt_ids, max_new_tokens, seed, stop)  # the prefill's token
    while session.requests:
        for out in session.step(): ...            # one Engine.step for every row in the batch
    session.remove(request)                        # a client went away: its row leaves now

A new request is prefilled alone (its own one-row KV cache), then its cache rows are
appended to the running batch's (``KVCache.append_rows``), so its tokens do not depend on
what else is in the batch: greedy output equals ``Engine.run`` on that prompt alone.  Rows
share one ``SamplingParams`` (a server keeps one session per strategy and sampling setting);
seeds are per row.  Components that keep per-row state see new request ids in
``StepContext.row_ids`` between steps (ids are never reused within a session).
"""

from __future__ import annotations

import torch

from .engine import Engine
from .engine_parts import Batch, Row, StepOutput, position_seed
from .errors import InvalidValueError
from .limits import context_length
from .sampling import SamplingParams, make_generator
from .verify import sample_next

__all__ = ["EngineSession"]


class EngineSession:
    """Continuous batching on one ``Engine``: ``add`` admits a request, ``step`` decodes one
    step for every active row and drops finished rows, ``remove`` drops a row at once.

    Only one session may use an engine at a time (it owns the engine's runner cache)."""

    def __init__(self, engine: Engine, sampling: SamplingParams, eos_ids: set[int]):
        self.engine, self.sampling, self.eos_ids = engine, sampling, set(eos_ids)
        self.batch: Batch | None = None

    @property
    def requests(self) -> list[int]:
        """The request ids of the rows decoding now, in batch order."""
        return [r.request for r in self.batch.active_rows()] if self.batch is not None else []

    def __len__(self) -> int:
        return len(self.batch.active_rows()) if self.batch is not None else 0

    @torch.inference_mode()
    def add(self, request: int, prompt: list[int], max_new_tokens: int, seed: int | None = None,
            stop: list[str] | tuple[str, ...] = ()) -> StepOutput:
        """Prefill ``prompt`` (token ids) as a new row ``request`` (an id not in the batch) and
        return its first token (``finish_reason`` set when that already ends it)."""
        eng = self.engine
        if request in self.requests:
            raise InvalidValueError(f"request {request} is already in this session: give each request its own id")
        context = context_length(eng.target)
        if not prompt:
            raise InvalidValueError("the prompt is empty: give at least one token")
        if context is not None and len(prompt) > context:
            raise InvalidValueError(f"the prompt has {len(prompt)} tokens; this model's context is {context} tokens: "
                                    f"shorten it")
        if self.batch is None or not self.batch.active_rows():
            self._begin(seed)
        batch = self.batch
        batch.deterministic = batch.deterministic and seed is not None
        row = Row(request, list(prompt), len(prompt), max_new_tokens, list(stop),
                  seed if seed is not None else int(torch.randint(0, 2**62, (1,))),
                  make_generator(0, eng.device), make_generator(0, eng.device), context=context)
        room = min(max_new_tokens, 256, (context - len(prompt)) if context is not None else 256)
        running = eng.runner.kv if batch.active_rows() else None
        eng.runner.start(1, capacity=len(prompt) + room + 32)
        try:
            out = eng.runner.prefill([prompt])
        except BaseException:
            eng.runner.kv = running  # the running rows keep their cache
            raise
        if running is not None:
            running.append_rows(eng.runner.kv)
            eng.runner.kv = running
        row.verify_gen.manual_seed(position_seed(row.seed, len(row.tokens), 0))
        last = [len(prompt) - 1]
        if self.sampling.greedy:
            first = out.argmax_at(last)[0]
        else:
            first = sample_next(out.logits_at(last), self.sampling, [row.verify_gen]).tolist()[0]
        batch.add_row(row, out, len(prompt))
        result = batch.emit(row, [first], self.eos_ids, eng.tokenizer)
        self._drop_finished()
        return result

    @torch.inference_mode()
    def step(self, queue_backlog: int = 0) -> list[StepOutput]:
        """One ``Engine.step`` for every active row (nothing when there is none); finished rows
        leave the batch afterwards.  ``queue_backlog``: requests waiting to join, reported in
        the step's statistics (``StepStats.queue_backlog``)."""
        if not len(self):
            return []
        self.batch.queue_backlog = queue_backlog
        outputs = self.engine.step(self.batch, self.eos_ids)
        self._drop_finished()
        return outputs

    def remove(self, request: int) -> bool:
        """Drop ``request``'s row now (e.g. its client disconnected); False when it is not here."""
        if request not in self.requests:
            return False
        for r in self.batch.active_rows():
            if r.request == request:
                r.finish_reason = "abort"
        self._drop_finished()
        return True

    def close(self) -> None:
        """Drop every row and the cache (the engine's failure report is logged)."""
        if self.batch is not None:
            self.engine.failures.finish()
        self.batch = None
        self.engine.runner.kv = None

    # ------------------------------------------------------------------------------------

    def _begin(self, seed: int | None) -> None:
        """A fresh batch: components reset as at the start of ``Engine.run``."""
        if self.batch is not None:
            self.engine.failures.finish()
        for reset in self.engine.bound.resets:
            reset()
        self.engine.failures.start()
        self.batch = Batch([], self.sampling, deterministic=seed is not None and not self.sampling.greedy)
        self.engine.runner.kv = None

    def _drop_finished(self) -> None:
        batch = self.batch
        keep = batch.drop_finished()
        if not batch.active_rows():
            self.engine.runner.kv = None  # the cache of finished rows is freed now
        elif keep is not None:
            self.engine.runner.select_rows(torch.tensor(keep, device=self.engine.device))
        batch.forget_finished()
