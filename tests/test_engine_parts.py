"""The engine's batch bookkeeping (``engine_parts.Batch``) on its own: the target hidden states
kept for a strategy between its proposals."""

from types import SimpleNamespace

import lightspec_core.engine_parts as parts
import torch
from lightspec_core.sampling import SamplingParams


def test_pending_hidden_states_keep_the_newest_within_the_cap(monkeypatch):
    """A strategy that does not propose for many steps gets, at its next propose, the states
    of the last ``MAX_PENDING_HIDDEN`` committed tokens per row, in order, with the position of
    the first of them; the chunks' width is counted as they arrive, and again when they are joined."""
    monkeypatch.setattr(parts, "MAX_PENDING_HIDDEN", 10)
    rows = [parts.Row(i, [1, 2, 3], 3, 100, [], 0, torch.Generator(), torch.Generator()) for i in range(2)]
    batch = parts.Batch(rows, SamplingParams(), deterministic=False)
    position = [0, 0]
    for step in range(9):
        q = 1 + step % 3  # forwards over 1-3 slots; row 0 keeps them all, row 1 its first one
        h = torch.arange(2 * q, dtype=torch.float32).reshape(2, q, 1) + 100 * step
        batch.add_hidden(SimpleNamespace(captured={1: h}), [list(range(q)), [0]], list(position))
        position = [position[0] + q, position[1] + 1]
        assert batch._pending_width <= 10 and batch._pending_width == sum(max(n) for _, n, _ in batch.pending)
    ctx = SimpleNamespace(device=torch.device("cpu"))
    batch.hand_over_hidden(ctx)
    assert ctx.hidden_lengths.tolist() == [10, 9] and ctx.hidden_positions.tolist() == [position[0] - 10, 0]
    expect0 = [100 * s + j for s in range(9) for j in range(1 + s % 3)][-10:]
    expect1 = [100 * s + 1 + s % 3 for s in range(9)]  # row 1's first slot of each forward
    assert ctx.hidden_states[1][0, :, 0].tolist() == expect0
    assert ctx.hidden_states[1][1, :9, 0].tolist() == expect1
    batch.hidden_seen()
    assert batch.pending == [] and batch._pending_width == 0
