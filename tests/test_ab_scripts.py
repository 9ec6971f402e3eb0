"""The pure parts of the A/B tools in scripts/ab/ (the rest of them times models, which tests don't)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

AB = Path(__file__).resolve().parents[1] / "scripts" / "ab"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, AB / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ngram_ceiling_replays_latest_and_oracle_lookup():
    nc = load("ngram_ceiling")
    assert nc.occurrences([5, 1, 2, 5, 3, 4, 5], 1) == [4, 1]  # after each earlier 5, latest first
    assert nc.matched([1, 2, 5], [1, 2, 8]) == 2
    prompt, out = [5, 1, 2, 5, 3, 4, 5], [1, 2, 8]
    # latest: after the last 5 comes 3 (miss, 1 token), then "5 1" -> 2 (hit) + the target's 8
    assert nc.tokens_per_verify(prompt, out, k=16, oracle=False) == (3, 2)
    # oracle: the first 5 is followed by "1 2": two drafts accepted plus the target's token
    assert nc.tokens_per_verify(prompt, out, k=16, oracle=True) == (3, 1)
    assert nc.tokens_per_verify(prompt, out, k=1, oracle=True) == (3, 2)


def test_ngram_ceiling_policies_pick_their_occurrence():
    nc = load("ngram_ceiling")
    # the suffix 4-gram 2 3 4 5 occurs twice: first after 1 (agreeing 5 tokens back, then 6),
    # later after 0 (agreeing 4 back, then 7)
    seq = [1, 2, 3, 4, 5, 6, 0, 2, 3, 4, 5, 7, 1, 2, 3, 4, 5]
    assert nc.draft(seq, 1, "latest") == [7]
    assert nc.draft(seq, 1, "longest_back") == [6]
    assert nc.draft(seq, 2, "latest8") == [6, 0]  # the 5-gram 1 2 3 4 5 matches the first
    # vote: 5 was followed by 1 twice and by 2 once; then 7 and 6 tie and the latest wins
    assert nc.draft([5, 1, 6, 5, 1, 7, 5, 2, 4, 5], 2, "vote") == [1, 7]
    assert nc.draft([1, 2, 3], 4, "vote") == [] and nc.draft([1, 2, 3], 4, "latest") == []
    assert nc.tokens_per_verify([5, 1, 2, 5, 3, 4, 5], [1, 2, 8], k=16, policy="oracle") == (3, 1)


def test_bench_targets_judges_the_batch_target_as_one_family():
    """scripts/bench_targets.py: a cell 2% below `none` in noisy rounds is "below 1" on its own
    but not measurably slower among 50 cells; a cell 10% below in every round is."""
    import math
    import random

    spec = importlib.util.spec_from_file_location("bench_targets", AB.parent / "bench_targets.py")
    bt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bt)
    rng = random.Random(1)

    def cell(name, ratio, noise, base):
        secs = [b / (ratio * math.exp(rng.gauss(0.0, noise))) for b in base]
        return {"name": name, "error": None, "tokens": 4096, "seconds": sum(secs), "round_tokens": [512] * 8,
                "round_seconds": secs, "speedup_vs_hf": sum(base) / sum(secs), "speedup_ci95": None}

    def runs(slow_ratio):
        out = {}
        for t in (0.0, 0.8):
            workloads = {}
            for w in range(5):
                base = [1.2 + 0.1 * rng.random() for _ in range(8)]
                results = [{"name": "none", "error": None, "tokens": 4096, "seconds": sum(base), "round_tokens": [512] * 8,
                            "round_seconds": base, "speedup_vs_hf": 1.0}]
                results += [cell(f"s{i}", 1.0, 0.01, base) for i in range(5)]
                results.append(cell("none (control)", 1.0, 0.01, base))
                workloads[f"w{w}"] = {"results": results}
            out[(8, t)] = {"workloads": workloads}
        out[(8, 0.8)]["workloads"]["w0"]["results"][1] = cell("s0", slow_ratio, 0.01, [1.25] * 8)
        return out

    name, text, met = bt.batch_target(runs(1.0))
    assert met and "no cell measurably slower" in text
    name, text, met = bt.batch_target(runs(0.90))
    assert not met and text.startswith("measurably slower (Holm") and "s0" in text.split(";")[0]


def test_policy_replay_replays_a_recording_and_digests_its_decisions(tmp_path, capsys):
    """``policy_replay.py replay`` feeds a recording (decision inputs and step events, in order)
    to a new policy: the same recording gives the same decisions digest every time, and a
    recording whose steps differ gives another."""
    import pickle
    from types import SimpleNamespace

    from test_budget import T1, history, step

    pr = load("policy_replay")

    def recording(accepted: int) -> str:
        calls = [("reset", None)]
        for i in range(30):
            calls.append(("budget", SimpleNamespace(batch=1, deterministic=False, draft_cost_hints={"draft_model": 0.2},
                                                    sampling=SimpleNamespace(greedy=True), row_ids=[0],
                                                    history=[history(3 * i, i)], device="cpu")))
            drafted = (3,) if i % 2 else (0,)
            calls.append(("stats", step(4 if i % 2 else 1, T1, drafted=drafted, accepted=(accepted if i % 2 else 0,),
                                        draft_s=0.3 * T1 if i % 2 else 0.0)))
        path = tmp_path / f"rec{accepted}.pkl"
        path.write_bytes(pickle.dumps({"strategy": "draft_model", "batch": 1, "budget": None, "calls": calls}))
        return str(path)

    digests = []
    for accepted in (3, 3, 0):
        pr.replay(recording(accepted), repeat=2, thrash_mb=1)
        out = capsys.readouterr().out
        assert "30 decisions" in out and "30 events learned" in out
        digests.append(out.rsplit("digest ", 1)[1].strip())
    assert digests[0] == digests[1] != digests[2]


def test_bench_targets_judges_the_plugin_targets_from_one_run():
    """scripts/bench_targets.py's issue 26/27 rows: accepted lengths pooled as tokens over steps,
    "on every workload" from each workload's point estimate, "beats"/"faster" from the paired
    rounds pooled (the 95% interval above 1)."""
    spec = importlib.util.spec_from_file_location("bench_targets", AB.parent / "bench_targets.py")
    bt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bt)
    base = {"code": [1.0, 1.1, 1.05, 0.98], "edit": [1.2, 1.15, 1.25, 1.22]}

    def res(name, speed, mal, w, wobble=0.0):
        secs = [b / speed * (1 + wobble * (-1) ** i) for i, b in enumerate(base[w])]
        return {"name": name, "error": None, "tokens": 256, "seconds": sum(secs), "tokens_per_s": 256 / sum(secs),
                "round_tokens": [64] * 4, "round_seconds": secs, "mean_accepted_length": mal}

    spec_by_w = {  # name: (speed vs none, mean accepted length) on code, edit
        "none": ((1.0, 1.0), (1.0, 1.0)), "eagle3": ((1.3, 2.0), (0.9, 2.0)), "eagle3_tree": ((1.4, 3.0), (1.0, 2.2)),
        "draft_model": ((1.1, 2.5), (1.0, 2.0)), "hybrid": ((1.1, 2.0), (2.0, 3.0)),
        "ngram": ((1.05, 1.5), (1.9, 2.8)), "union.yaml": ((1.15, 2.6), (2.2, 3.1)), "dspark": ((1.3, 2.6), (1.1, 2.5))}
    run = {"workloads": {w: {"results": [res(n, *v[i], w, 0.01) for n, v in spec_by_w.items()]}
                         for i, w in enumerate(base)}}
    rows = {name: (text, met) for name, text, met in bt.plugin_targets(run)}
    assert abs(bt.accepted_overall(run, "eagle3_tree") - 512 / (256 / 3.0 + 256 / 2.2)) < 1e-9
    tree = next(v for k, v in rows.items() if "`eagle3_tree` ≥ +20%" in k)
    assert tree[1] and "+" in tree[0]  # 2.54 against 2.0 (+27%), speed 1.08 and 1.11 of the chain
    dspark = next(v for k, v in rows.items() if "`dspark` mean" in k)
    assert dspark[1] and dspark[0].startswith("2.55")  # 2.55 >= 2.5 and 1.18× / 1.1× draft_model in every round
    union = next(v for k, v in rows.items() if "union.yaml" in k)
    assert union[1]
    best = next(v for k, v in rows.items() if "best strategy" in k)
    # the union: 2.20× on edit, but 1.55× overall (9.0 s of `none` against 5.8 s), below 1.6×
    assert not best[1] and "best overall `union.yaml` 1.55×" in best[0] and "`edit` 2.20×" in best[0]
    above = [v for k, v in rows.items() if "`eagle3` tokens/s" in k]
    assert len(above) == 2 and not any(met for _, met in above)  # 0.9× draft_model on edit, 0.45× hybrid
    table = bt.vs_none_table(run)
    assert table[2] == "| union.yaml | 1.15× / 2.60 | 2.20× / 3.10 | 1.55× |"
