"""``lightspec bench``'s HF baselines run on stock models (loaded by transformers alone),
HF ``generate`` on LightSpec's own target is a row of its own, and LightSpec methods
report their bubble ratio."""

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import save_tiny
from lightspec_core.cli import main
from lightspec_core.loading import has_cpu_kernels
from lightspec_core.stats import RequestSummary, StepStats

from lightspec_core import bench, pipeline


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_models")
    return str(save_tiny(root / "target")), str(save_tiny(root / "draft", seed=1))


def test_hf_baselines_run_on_stock_copies_and_the_kernels_row_on_lightspecs_target(folders, tmp_path, capsys,
                                                                                   monkeypatch):
    target_dir, draft_dir = folders
    seen = {}  # row name -> (model, extra generate arguments)

    class RecordingHF(bench.HFMethod):
        def __init__(self, model, label, extra, temperature, device):
            seen[label] = (model, extra)
            super().__init__(model, label, extra, temperature, device)

    loads = []
    real_load = pipeline.load_model

    def counting_load(name, *args, **kw):
        loads.append((str(name), kw.get("cpu_layout", True)))
        return real_load(name, *args, **kw)

    monkeypatch.setattr(bench, "HFMethod", RecordingHF)
    monkeypatch.setattr(pipeline, "load_model", counting_load)
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat the cat\none two three one two three\n")
    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    rc = main(["bench", "--model", target_dir, "--draft-model", draft_dir, "--prompts", str(prompts),
               "--strategy", "none", "--strategy", "draft_model", "--strategy", "layerskip", "--max-new-tokens", "4",
               "--device", "cpu", "--dtype", "float32", "--json", str(out_json), "--markdown", str(out_md)])
    assert rc == 0, capsys.readouterr().err
    # one copy of each model for LightSpec (kernels) and one stock copy for HF
    assert sorted(loads) == sorted([(target_dir, True), (draft_dir, True), (target_dir, False), (draft_dir, False)])
    stock = {"hf_vanilla", "hf_prompt_lookup(10)", "hf_assisted", "hf_early_exit(1)"}
    assert set(seen) == stock | {bench.KERNELS_ROW}
    for name in stock:
        model, extra = seen[name]
        assert not has_cpu_kernels(model), name
        assert model.config._attn_implementation == "sdpa"
    assert not has_cpu_kernels(seen["hf_assisted"][1]["assistant_model"])
    kernels_model = seen[bench.KERNELS_ROW][0]
    assert has_cpu_kernels(kernels_model) and kernels_model is not seen["hf_vanilla"][0]

    report = json.loads(out_json.read_text())
    (w,) = report["runs"][0]["workloads"].values()
    by_name = {r["name"]: r for r in w["results"]}
    assert w["baseline"] == "hf_vanilla" and set(by_name) == stock | {bench.KERNELS_ROW, "none", "draft_model", "layerskip"}
    for r in w["results"]:
        assert r["error"] is None, r
        if r["name"] != "hf_vanilla":  # greedy outputs all equal stock HF vanilla's
            assert r["identical_to_hf"] == r["identical_checked"] == 2, r
        if r["family"] == "hf":
            assert r["bubble_ratio"] is None
        else:
            assert 0 <= r["bubble_ratio"] <= 1 and 0 <= r["bubble_ratio_lockstep"] <= 1, r
    # speculation's own gain: LightSpec's methods against `none` as well as against HF
    plain = by_name["none"]["tokens_per_s"]
    for r in w["results"]:
        if r["family"] == "hf":
            assert r["speedup_vs_none"] is None and r["speedup_vs_none_ci95"] is None
        else:
            assert r["speedup_vs_none"] == pytest.approx(r["tokens_per_s"] / plain)
    assert by_name["none"]["speedup_vs_none"] == 1.0 and by_name["none"]["speedup_vs_none_ci95"] is None
    ci = by_name["draft_model"]["speedup_vs_none_ci95"]
    assert ci is None or ci[0] <= ci[1]
    assert any("stock copies" in n for n in report["notes"])
    assert any(n.startswith(bench.KERNELS_ROW) for n in report["notes"])
    md = out_md.read_text()
    assert f"| {bench.KERNELS_ROW} |" in md and "| bubble |" in md and "stock copies" in md
    assert "| method (all workloads) | tok/s | speed-up vs hf_vanilla | vs `none` |" in md
    assert "| hf_vanilla | " in md and "| none | " in md
    overall_rows = [line for line in md.splitlines() if line.startswith("| draft_model |")]
    assert overall_rows[0].count("|") == 5 and overall_rows[1].count("|") == 12  # the overall row, the workload's
    table = capsys.readouterr().out
    assert bench.KERNELS_ROW in table and "bubble" in table and "vs none (95% CI)" in table


def test_no_stock_copies_without_hf_baselines(folders, tmp_path, capsys, monkeypatch):
    target_dir, _ = folders
    loads = []
    real_load = pipeline.load_model
    monkeypatch.setattr(pipeline, "load_model", lambda name, *a, **kw: loads.append(kw.get("cpu_layout", True))
                        or real_load(name, *a, **kw))
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat\n")
    out_json = tmp_path / "b.json"
    rc = main(["bench", "--model", target_dir, "--prompts", str(prompts), "--strategy", "none", "--no-hf",
               "--max-new-tokens", "2", "--json", str(out_json)])
    assert rc == 0, capsys.readouterr().err
    assert loads == [True] and json.loads(out_json.read_text())["notes"] == []


def step(kind="step", step_time_s=0.0, overhead_s=0.0, bubble_ratio=0.0):
    return StepStats(kind=kind, step=0, row_ids=[0], step_time_s=step_time_s, device_time_s=None,
                     peak_memory_bytes=0, drafted=[0], accepted=[0], emitted=[1], sources=[""], confidence=[None],
                     entropy=[None], stage_s={}, target_forward_s=0.0, draft_forward_s=0.0, overhead_s=overhead_s,
                     verify_tokens=1, bubble_ratio=bubble_ratio)


class FakePipe:
    """Emits a fixed stream of step events on every ``generate`` (what the engine's sinks hear)."""

    device = torch.device("cpu")

    def __init__(self, events):
        self.events = events
        self.bound = SimpleNamespace(sinks=[])

    def generate(self, chunk, **kw):
        for e in self.events:
            for sink in list(self.bound.sinks):
                sink(e)
        return [SimpleNamespace(token_ids=[5], stats=RequestSummary(steps=len(self.events))) for _ in chunk]


def test_bubble_ratio_is_weighted_by_step_time_in_lockstep_and_alone():
    timed = [step(step_time_s=0.010, overhead_s=0.001, bubble_ratio=0.5), step(step_time_s=0.030, bubble_ratio=0.1),
             step(kind="prefill", step_time_s=1.0, bubble_ratio=1.0)]  # not a step: left out
    pipe = FakePipe(timed)
    method = bench.LightSpecMethod(pipe, "fake", 0.0)
    method.run([[1, 2]], 1, None)
    pipe.events = [step(step_time_s=0.02, bubble_ratio=0.25), step(step_time_s=0.06, bubble_ratio=0.0)]
    method.measure_overhead([[[1, 2]], [[3]]], 1, None)  # two chunks: the alone stream runs twice
    method.finish()
    d = method.result.to_dict(None)
    assert d["bubble_ratio_lockstep"] == pytest.approx((0.5 * 0.010 + 0.1 * 0.030) / 0.040)  # 0.2, not the mean 0.3
    assert d["bubble_ratio"] == pytest.approx(2 * (0.25 * 0.02) / (2 * 0.08))  # runs alone come first
    assert d["overhead_fraction_lockstep"] == pytest.approx(0.001 / 0.040)
    table = bench.format_table("w", {"baseline": None, "results": [d]}, 1)
    header, row = table.splitlines()[2:4]
    assert "bubble" in header and f"{d['bubble_ratio']:.1%}" in row


def test_a_method_without_timed_steps_has_no_bubble_ratio():
    d = bench.MethodResult("hf_vanilla", "hf").to_dict(None)
    assert d["bubble_ratio"] is None and d["bubble_ratio_lockstep"] is None


@pytest.mark.parametrize("interleave", ["step", "step-mixed"])
def test_hf_baselines_take_their_lockstep_turns_apart_from_lightspecs_methods(folders, tmp_path, capsys, monkeypatch,
                                                                             interleave):
    """By default HF's stock-model steps never run between two LightSpec steps (they slowed
    every LightSpec step, a plain one most); ``step-mixed`` keeps the old single lockstep."""
    target_dir, draft_dir = folders
    groups = []
    real = bench.run_lockstep

    def recording(methods, *args, **kw):
        groups.append([type(m).__name__ for m in methods])
        return real(methods, *args, **kw)

    monkeypatch.setattr(bench, "run_lockstep", recording)
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat the cat\none two three one two three\n")
    rc = main(["bench", "--model", target_dir, "--draft-model", draft_dir, "--prompts", str(prompts),
               "--strategy", "none", "--strategy", "ngram", "--max-new-tokens", "3", "--interleave", interleave,
               "--json", str(tmp_path / "b.json")])
    assert rc == 0, capsys.readouterr().err
    kinds = [set(g) for g in groups]
    if interleave == "step":
        assert kinds and all(len(k) == 1 for k in kinds), groups  # each lockstep holds one family
        assert [k.pop() for k in kinds[:4]] == ["LightSpecMethod", "HFMethod", "HFMethod", "LightSpecMethod"]
    else:
        assert all(k == {"HFMethod", "LightSpecMethod"} for k in kinds), groups
    report = json.loads((tmp_path / "b.json").read_text())
    (w,) = report["runs"][0]["workloads"].values()
    assert all(len(r["round_seconds"]) == 2 for r in w["results"]), "one round per batch of prompts"
