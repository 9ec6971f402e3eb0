"""Runtime statistics: the JSONL step events, the per-request summaries ``generate()``
returns, and the periodic "SpecDecoding metrics" log line."""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
from lightspec_core.stats import LogSink, RequestSummary, StepStats
from models import ToyTokenizer, cached_model, hf_greedy, make_prompts

from lightspec_core import MTPPipeline

PROMPTS = make_prompts(5, seed=5)
N_NEW = 18
STEP_FIELDS = {f.name for f in dataclasses.fields(StepStats)} | {"acceptance_rate", "mean_accepted_length",
                                                                   "per_token_latency_s"}
STAGES = {"budget", "draft", "verify_forward", "verify", "commit"}


@pytest.fixture(scope="module")
def tok():
    return ToyTokenizer()


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(tmp_path, tok, strategy, eos=None, **kw):
    model = cached_model("llama")
    draft = {"draft_model": cached_model("llama", 1, 1), "self": model}.get(strategy)
    path = tmp_path / "s.jsonl"
    pipe = MTPPipeline(model, tok, strategy="draft_model" if strategy == "self" else strategy, draft_model=draft,
                       stats_out=str(path), **kw)
    if eos is not None:
        pipe.eos_ids = set(eos)
    out = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=eos is None)
    return out, read_jsonl(path), path


def check_step_events(steps, out):
    n_req = len(out)
    seen_last: dict[int, int] = {}
    emitted_sum = {i: 0 for i in range(n_req)}
    per_req = {i: {"steps": 0, "drafted": 0, "accepted": 0} for i in range(n_req)}
    finished = set()
    for k, ev in enumerate(steps):
        assert STEP_FIELDS <= set(ev), f"missing fields: {STEP_FIELDS - set(ev)}"
        assert ev["kind"] == "step"
        assert ev["step"] == k + 1
        B = len(ev["row_ids"])
        assert B >= 1
        for key in ("drafted", "accepted", "emitted", "sources", "confidence", "entropy"):
            assert len(ev[key]) == B, key
        assert set(ev["stage_s"]) == STAGES
        assert all(v >= 0 for v in ev["stage_s"].values())
        assert ev["step_time_s"] > 0 and ev["target_forward_s"] > 0
        assert ev["overhead_s"] >= 0 and ev["draft_forward_s"] >= 0
        assert ev["overhead_s"] <= ev["step_time_s"] + 1e-9
        assert ev["device_time_s"] is None  # CPU
        assert ev["peak_memory_bytes"] > 0
        assert ev["verify_tokens"] >= max(ev["drafted"]) + 1
        assert ev["failure"] is None
        d_tot = sum(ev["drafted"])
        if d_tot:
            assert ev["acceptance_rate"] == pytest.approx(sum(ev["accepted"]) / d_tot)
        else:
            assert ev["acceptance_rate"] is None
        assert ev["per_token_latency_s"] == pytest.approx(ev["step_time_s"] / sum(ev["emitted"]))
        for b, rid in enumerate(ev["row_ids"]):
            assert rid not in finished, f"request {rid} appears after it finished"
            d, a, e = ev["drafted"][b], ev["accepted"][b], ev["emitted"][b]
            assert 0 <= a <= d, (d, a)
            assert 1 <= e <= a + 1
            if e != a + 1:  # only a stop may cut a step: the row must finish here
                finished.add(rid)
            if d:
                assert ev["sources"][b], "a row that drafted has no source"
            emitted_sum[rid] += e
            per_req[rid]["steps"] += 1
            per_req[rid]["drafted"] += d
            per_req[rid]["accepted"] += a
            seen_last[rid] = k
    for i, o in enumerate(out):
        s = o.stats
        # the prefill emits the first token; every later token comes from a step
        assert emitted_sum[i] + 1 == s.new_tokens == len(o.token_ids)
        assert s.steps == per_req[i]["steps"]
        assert s.drafted == per_req[i]["drafted"]
        assert s.accepted == per_req[i]["accepted"]
    return per_req


def check_summary(o, prompt_len):
    s = o.stats
    assert isinstance(s, RequestSummary)
    assert s.prompt_tokens == prompt_len
    assert s.new_tokens == len(o.token_ids)
    assert s.finish_reason == o.finish_reason
    assert 0 <= s.accepted <= s.drafted
    pd, pa = s.per_position_drafted, s.per_position_accepted
    assert len(pd) == len(pa)
    assert all(a <= d for a, d in zip(pa, pd))
    assert all(x >= y for x, y in zip(pd, pd[1:])), pd
    assert all(x >= y for x, y in zip(pa, pa[1:])), pa
    assert sum(pa) == s.accepted and sum(pd) == s.drafted
    assert s.mean_accepted_length == pytest.approx(s.new_tokens / s.steps)
    if s.drafted:
        assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
        assert sum(s.sources.values()) == pd[0]
    assert s.wall_time_s > 0 and s.prefill_time_s > 0
    assert s.tokens_per_s > 0
    d = s.to_dict()
    for key in ("new_tokens", "steps", "drafted", "accepted", "per_position_acceptance", "mean_accepted_length",
                "acceptance_rate", "tokens_per_s", "failures", "sources"):
        assert key in d


@pytest.mark.parametrize("strategy", ["draft_model", "self", "ngram", "hybrid", "none"])
def test_jsonl_and_summaries(tmp_path, tok, strategy):
    kw = {} if strategy in ("hybrid", "none") else {"budget": {"type": "static", "k": 3}}
    out, events, _ = run(tmp_path, tok, strategy, **kw)
    steps = [e for e in events if e["kind"] == "step"]
    assert steps
    check_step_events(steps, out)
    for o, p in zip(out, PROMPTS):
        check_summary(o, len(p))
        assert o.stats.new_tokens == N_NEW
    if strategy == "self":
        assert sum(o.stats.accepted for o in out) > 0
    if strategy in ("self", "draft_model"):
        # a model drafter reports its first-slot peak probability and entropy
        vals = [(e["confidence"][b], e["entropy"][b]) for e in steps for b in range(len(e["row_ids"])) if e["drafted"][b]]
        assert vals
        assert all(c is not None and 0 < c <= 1 and h is not None and h >= 0 for c, h in vals), vals[:3]
        assert all(src == "draft_model" for e in steps for src, d in zip(e["sources"], e["drafted"]) if d)
        # the drafter times its own forwards: seconds without setup, and its longest row's draft
        for e in steps:
            if max(e["drafted"]) > 0:
                assert set(e["draft_by_source"]) == {"draft_model"}
                spent, k = e["draft_by_source"]["draft_model"]
                assert 1 <= k <= max(e["drafted"]) and 0 <= spent <= e["draft_forward_s"] + 1e-9
    if strategy in ("ngram", "none"):  # nothing runs a draft model
        assert all(e["draft_by_source"] == {} for e in steps)
    if strategy == "ngram":
        assert all(src == "ngram" for e in steps for src, d in zip(e["sources"], e["drafted"]) if d)
    if strategy == "hybrid":  # no draft model given: n-gram or layer skip, per row and step
        used = {src for e in steps for src, d in zip(e["sources"], e["drafted"]) if d}
        assert used and used <= {"ngram", "layerskip"}, used
    if strategy == "none":
        assert all(sum(e["drafted"]) == 0 for e in steps)
        assert all(o.stats.steps == N_NEW - 1 for o in out)


def test_stop_cuts_a_step(tmp_path, tok):
    """With draft == target and eos inside an accepted run, the step emits fewer tokens
    than accepted + 1, and that row ends there."""
    model = cached_model("llama")
    ref = hf_greedy(model, PROMPTS[0], N_NEW)
    eos = ref[6]
    out, events, _ = run(tmp_path, tok, "self", eos={eos}, budget={"type": "static", "k": 4})
    steps = [e for e in events if e["kind"] == "step"]
    check_step_events(steps, out)
    assert out[0].finish_reason == "stop"
    assert out[0].token_ids == ref[: ref.index(eos) + 1]
    cut = [(b, e) for e in steps for b, rid in enumerate(e["row_ids"])
           if rid == 0 and e["emitted"][b] < e["accepted"][b] + 1]
    assert cut, "the eos did not land inside an accepted run"
    for o, p in zip(out, PROMPTS):
        check_summary(o, len(p))


def test_jsonl_appends_across_calls(tmp_path, tok):
    model = cached_model("llama")
    path = tmp_path / "s.jsonl"
    pipe = MTPPipeline(model, tok, strategy="ngram", stats_out=str(path))
    pipe.generate(PROMPTS[:2], max_new_tokens=5, ignore_eos=True)
    n1 = len([e for e in read_jsonl(path) if e["kind"] == "step"])
    pipe.generate(PROMPTS[:2], max_new_tokens=5, ignore_eos=True)
    n2 = len([e for e in read_jsonl(path) if e["kind"] == "step"])
    assert n1 == 4 and n2 == 8


def test_jsonl_has_request_summaries(tmp_path, tok):
    """hookspecs.lightspec_on_stats: sinks receive "one StepStats event per decode step
    (and a RequestSummary when a request finishes)"."""
    out, events, _ = run(tmp_path, tok, "ngram")
    reqs = [e for e in events if e["kind"] == "request"]
    assert sorted(e["request"] for e in reqs) == list(range(len(PROMPTS)))
    for e, o in zip(sorted(reqs, key=lambda e: e["request"]), out):
        assert e["new_tokens"] == N_NEW == o.stats.new_tokens
        assert e["finish_reason"] == "length"
        for key in ("per_position_acceptance", "mean_accepted_length", "acceptance_rate", "tokens_per_s"):
            assert key in e


def test_jsonl_request_summary_is_final(tmp_path, tok):
    """The request line written to the JSONL equals the summary generate() returns and
    comes after the request's last step line."""
    out, events, _ = run(tmp_path, tok, "self", budget={"type": "static", "k": 3})
    reqs = [e for e in events if e["kind"] == "request"]
    assert len(reqs) == len(PROMPTS)
    for e, o in zip(sorted(reqs, key=lambda e: e["request"]), out):
        assert e["steps"] == o.stats.steps
        assert e["accepted"] == o.stats.accepted and e["drafted"] == o.stats.drafted
        assert e["per_position_drafted"] == o.stats.per_position_drafted
    # request lines come after that request's last step line
    for e in reqs:
        i = events.index(e)
        assert all(e["request"] not in ev["row_ids"] for ev in events[i + 1:] if ev["kind"] == "step")


def _event(row_ids, drafted, accepted, emitted):
    return StepStats(kind="step", step=1, row_ids=row_ids, step_time_s=0.01, device_time_s=None, peak_memory_bytes=1,
                     drafted=drafted, accepted=accepted, emitted=emitted, sources=["x"] * len(row_ids),
                     confidence=[None] * len(row_ids), entropy=[None] * len(row_ids), stage_s={},
                     target_forward_s=0.005, draft_forward_s=0.0, overhead_s=0.005, verify_tokens=max(drafted) + 1)


LINE = re.compile(
    r"^SpecDecoding metrics: Draft acceptance rate: (?P<rate>[\d.]+)%, Mean acceptance length: (?P<mean>[\d.]+), "
    r"Accepted: (?P<acc>\d+) tokens, Drafted: (?P<dr>\d+) tokens, Per-position acceptance rate: (?P<pos>.*)$"
)


def test_log_sink_line(caplog):
    sink = LogSink(interval_s=3600)
    sink.lightspec_on_stats(event=_event([0, 1], [3, 2], [3, 0], [4, 1]))
    sink.lightspec_on_stats(event=_event([0], [2], [1], [2]))
    m = LINE.match(sink.line())
    assert m, sink.line()
    assert int(m["acc"]) == 4 and int(m["dr"]) == 7
    assert float(m["rate"]) == pytest.approx(100 * 4 / 7, abs=0.05)
    assert float(m["mean"]) == pytest.approx(7 / 3, abs=0.005)
    # position 0: drafted 3 times, accepted 2; position 1: drafted 3, accepted 1; position 2: 1, 1
    assert [float(x) for x in m["pos"].split(", ")] == pytest.approx([2 / 3, 1 / 3, 1.0], abs=5e-4)
    with caplog.at_level(logging.INFO, logger="lightspec.stats"):
        sink.flush()
    assert any(LINE.match(r.getMessage()) for r in caplog.records)
    assert sink.verifies == 0  # flush resets the window


def test_log_sink_through_pipeline(tok, caplog):
    model = cached_model("llama")
    pipe = MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget={"type": "static", "k": 2},
                       log_interval_s=1e-9)
    with caplog.at_level(logging.INFO, logger="lightspec.stats"):
        pipe.generate(PROMPTS[:2], max_new_tokens=8, ignore_eos=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "lightspec.stats"]
    assert lines and all(LINE.match(x) for x in lines)
    assert any(int(LINE.match(x)["acc"]) > 0 for x in lines)


def test_step_event_properties():
    ev = _event([0, 1, 2], [4, 0, 2], [1, 0, 2], [2, 1, 3])
    assert ev.drafted_total == 6 and ev.drafted_max == 4 and ev.accepted_total == 3
    assert ev.acceptance_rate == pytest.approx(0.5)
    d = ev.to_dict()
    assert d["mean_accepted_length"] == pytest.approx((2 + 1 + 3) / 3)
    assert d["per_token_latency_s"] == pytest.approx(0.01 / 6)
    assert json.loads(json.dumps(d)) == d
    empty = _event([0], [0], [0], [1])
    assert empty.acceptance_rate is None


def test_a_proposal_knows_each_rows_draft_depth():
    import torch
    from lightspec_core.interfaces import DraftProposal

    chain = DraftProposal(tokens=torch.tensor([[5, 6, 7], [8, 0, 0]]), lengths=torch.tensor([3, 1]))
    assert chain.depth_rows() == [3, 1]
    # row 0: two children of the root, then a grandchild under the second (depth 2) and a
    # great-grandchild (depth 3); row 1: four siblings (depth 1); row 2: no draft
    tree = DraftProposal(tokens=torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [0, 0, 0, 0]]),
                         lengths=torch.tensor([4, 4, 0]),
                         parents=torch.tensor([[-1, -1, 1, 2], [-1, -1, -1, -1], [-1, -1, -1, -1]]))
    assert tree.depth_rows() == [3, 1, 0]


def test_levels_are_the_depth_when_given_else_the_drafted_count():
    ev = _event([0, 1], [4, 2], [2, 0], [3, 1])
    assert ev.levels == [4, 2]
    assert dataclasses.replace(ev, depth=[2, 2]).levels == [2, 2]


def test_per_position_acceptance_counts_a_trees_levels_not_its_nodes():
    from lightspec_core.stats import SummaryCollector

    sink = SummaryCollector()
    sink.start(0, prompt_tokens=5)
    # a 6-node tree of depth 3 accepted to its depth, then one of depth 2 accepted 1 level
    sink.lightspec_on_stats(event=dataclasses.replace(_event([0], [6], [3], [4]), depth=[3]))
    sink.lightspec_on_stats(event=dataclasses.replace(_event([0], [5], [1], [2]), depth=[2]))
    s = sink.summaries[0]
    assert s.per_position_drafted == [2, 2, 1] and s.per_position_accepted == [2, 1, 1]
    assert s.drafted == 11 and s.accepted == 4
