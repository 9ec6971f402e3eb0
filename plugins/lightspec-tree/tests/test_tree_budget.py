"""The tree budget: the whole node budget while speculation pays, plain steps that measure
plain decoding, holds while speculation measures slower, and no timings on seeded runs."""

from types import SimpleNamespace

import pytest
import torch
from lightspec_tree.budget import TreeBudget

from lightspec_core import StepContext


def _ctx(batch=1, deterministic=False):
    return StepContext(step=1, sequences=[(1, 2)] * batch, row_ids=list(range(batch)), deterministic=deterministic)


def _step(budget, drafted, emitted, seconds, batch=1):
    budget.lightspec_on_stats(event=SimpleNamespace(kind="step", failure=None, step_time_s=seconds,
                                                    row_ids=list(range(batch)), drafted=[drafted] * batch,
                                                    emitted=[emitted] * batch))


def _run(budget, spec_emitted, spec_s, plain_s, steps):
    reasons = []
    for _ in range(steps):
        b = budget.lightspec_budget(ctx=_ctx())
        k = int(b.max_draft[0])
        reasons.append(b.reason)
        if k:
            _step(budget, k, spec_emitted, spec_s)
        else:
            _step(budget, 0, 1, plain_s)
    return reasons


def test_probes_plain_decoding_then_drafts_the_whole_node_budget():
    budget = TreeBudget(max_nodes=12, probe_every=4)
    reasons = _run(budget, spec_emitted=3, spec_s=0.02, plain_s=0.01, steps=11)  # 150 tok/s vs 100 plain
    assert reasons == ["probe"] + ["tree"] * 4 + ["probe"] + ["tree"] * 4 + ["probe"]
    budget.reset()  # a new generate() keeps what plain decoding measured
    assert budget.plain and budget.lightspec_budget(ctx=_ctx()).reason == "tree"
    b = budget.lightspec_budget(ctx=_ctx(batch=3))  # a batch size not seen yet is probed first
    assert b.reason == "probe" and b.max_draft.tolist() == [0, 0, 0]
    _step(budget, 0, 1, 0.01, batch=3)
    # the batch's verify width stays within 2 * max_nodes: 24 // 3 = 8 nodes a row
    assert budget.lightspec_budget(ctx=_ctx(batch=3)).max_draft.tolist() == [8, 8, 8]
    _step(budget, 0, 1, 0.01, batch=48)
    assert budget.lightspec_budget(ctx=_ctx(batch=48)).max_draft.tolist() == [1] * 48


def test_holds_plain_decoding_where_speculation_measures_slower():
    budget = TreeBudget(max_nodes=8, probe_every=100, patience=3, hold=5)
    reasons = _run(budget, spec_emitted=2, spec_s=0.04, plain_s=0.01, steps=22)  # 50 tok/s vs 100 plain
    assert reasons[:4] == ["probe", "tree", "tree", "tree"]
    assert reasons[4:9] == ["hold"] * 5 and reasons[9:12] == ["tree"] * 3
    assert reasons[12:22] == ["hold"] * 10  # lost again: a hold twice as long
    # where speculation wins, drafting goes on and the next hold is short again
    budget.holding = 0
    assert _run(budget, spec_emitted=4, spec_s=0.01, plain_s=0.01, steps=3) == ["tree"] * 3
    assert budget.backoff == 1


def test_seeded_runs_always_draft():
    budget = TreeBudget(max_nodes=5, patience=1, hold=50)
    _step(budget, 0, 1, 0.001)
    _step(budget, 5, 1, 1.0)  # slower, but a seeded run does not look at timings
    b = budget.lightspec_budget(ctx=_ctx(batch=2, deterministic=True))
    assert b.max_draft.tolist() == [5, 5] and b.reason == "tree"
    assert torch.equal(b.min_confidence, torch.zeros(2))


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="max_nodes=0 is invalid"):
        TreeBudget(max_nodes=0)
    with pytest.raises(ValueError, match="decay=1 is invalid"):
        TreeBudget(decay=1)
