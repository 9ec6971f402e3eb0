"""CLI behaviour: one clear error line and a non-zero exit for bad input, tracebacks only
with --debug, --help without torch, --json output."""

import json
import subprocess
import sys

import pytest
from helpers import run_cli, save_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("cli_model")))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "--strategy", "nope"], "unknown strategy 'nope'; available:"),
        (["run", "--model", "/does/not/exist"], "'/does/not/exist' not found"),
        (["run", "--temperature", "-1"], "temperature=-1.0 is invalid"),
        (["run", "--top-p", "0"], "top_p=0.0 is invalid"),
        (["run", "--max-new-tokens", "0"], "--max-new-tokens 0 is invalid"),
        (["run", "--strategy", "/no/such/file.yaml"], "strategy file '/no/such/file.yaml' does not exist"),
        (["run", "--device", "tpu9"], "device='tpu9' is invalid"),
        (["run", "--dtype", "int3"], "dtype='int3' is invalid"),
        (["bench", "--suite", "weird"], "--suite 'weird' is unknown"),
        (["bench", "--suite", "default", "--repeat", "0"], "--repeat 0 is invalid"),
        (["bench", "--suite", "default", "--batch-repeat", "0"], "--batch-repeat 0 is invalid"),
        (["bench", "--suite", "default", "--interleave", "token"], "--interleave 'token' is invalid; allowed: step, step-mixed, batch"),
        (["bench", "--suite", "default", "--limit", "0"], "--limit 0 is invalid: use an integer >= 1"),
        (["bench", "--suite", "default", "--limit", "-1"], "--limit -1 is invalid: use an integer >= 1"),
        (["run", "--threads", "0"], "--threads 0 is invalid: use an integer >= 1"),
        (["run", "--temperature", "1e-39"], "temperature=1e-39 is too small"),
        (["run", "--stop", ""], "--stop '' is invalid"),
        (["run", "--max-new-tokens", "100000"], "max_new_tokens=100000 is invalid: use an integer in 1..2048"),
        (["run", "--eos-token-id", "96"], "eos_token_id 96 is outside this model's vocabulary: allowed ids are [0, 96)"),
        (["run", "--max-new-tokens", "x"], "Invalid value for '--max-new-tokens': 'x' is not a valid integer"),
    ],
)
def test_cli_errors_are_one_line(args, needle, capsys, model_dir):
    full = list(args)
    if full[0] == "run":
        full += ["--prompt", "abc"]
        if "--model" not in full:
            full += ["--model", model_dir]
    if full[0] == "bench":
        full += ["--model", model_dir]
    rc, out, err = run_cli(full, capsys)
    assert rc != 0
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err and "Usage:" not in err


def test_cli_debug_shows_the_traceback(model_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "lightspec_core.cli", "--debug", "run", "--model", model_dir, "--strategy", "nope", "--prompt", "a"],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_cli_bad_input_exits_2_with_one_stderr_line(model_dir, tmp_path):
    """The real entry point in a subprocess: exit code 2, exactly one stderr line."""
    proc = subprocess.run(
        [sys.executable, "-m", "lightspec_core.cli", "bench", "--model", model_dir, "--suite", "default", "--limit", "0"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["error: --limit 0 is invalid: use an integer >= 1 (leave it out for all prompts)"]


def test_cli_missing_prompts_file(capsys, model_dir):
    rc, _, err = run_cli(["run", "--model", model_dir, "--prompts-file", "/no/prompts.jsonl"], capsys)
    assert rc == 2 and "cannot read prompts file '/no/prompts.jsonl'" in err


def test_cli_run_json(capsys, model_dir):
    rc, out, err = run_cli(["run", "--model", model_dir, "--strategy", "ngram", "--prompt", "abcabc", "--prompt", "xy",
                            "--max-new-tokens", "6", "--json"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert [d["prompt"] for d in data] == ["abcabc", "xy"]
    for d in data:
        assert len(d["token_ids"]) == 6 or d["finish_reason"] == "stop"
        assert {"drafted", "accepted", "mean_accepted_length", "per_position_acceptance"} <= set(d["stats"])


def test_cli_strategies_and_plugins_json(capsys):
    rc, out, _ = run_cli(["strategies", "--json"], capsys)
    assert rc == 0
    names = {r["name"] for r in json.loads(out) if r["kind"] == "strategy"}
    assert {"none", "ngram", "draft_model", "layerskip", "hybrid"} <= names
    rc, out, _ = run_cli(["plugins", "--json"], capsys)
    assert rc == 0 and "builtin" in {p["name"] for p in json.loads(out)["plugins"]}


def test_cli_help_does_not_import_torch():
    code = "import sys; from lightspec_core.cli import main; main(['--help']); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"


def test_cli_bench_compares_with_hf_on_the_same_prompts(capsys, model_dir, tmp_path):
    """A small end-to-end ``lightspec bench``: HF baselines and LightSpec strategies on
    one prompts file, each batch run twice (``--repeat 2``), every greedy output compared
    with HF vanilla, JSON and Markdown written."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat the cat\none two three one two three\nred green blue red\n")
    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    rc, out, err = run_cli(["bench", "--model", model_dir, "--prompts", str(prompts), "--strategy", "none",
                            "--strategy", "ngram", "--strategy", "layerskip", "--max-new-tokens", "8", "--repeat", "2",
                            "--json", str(out_json), "--markdown", str(out_md)], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    (run,) = report["runs"]
    (w,) = run["workloads"].values()
    assert w["prompts"] == 3 and w["baseline"] == "hf_vanilla" and report["repeat"] == 2
    by_name = {r["name"]: r for r in w["results"]}
    assert {"hf_vanilla", "hf_prompt_lookup(10)", "none", "ngram", "layerskip"} <= set(by_name)
    assert any(n.startswith("hf_early_exit(") for n in by_name)
    for r in w["results"]:
        assert r["error"] is None, r
        assert r["tokens"] == 2 * 3 * 8 and r["tokens_per_s"] > 0  # both rounds count
        if r["name"] != "hf_vanilla":
            # greedy: every output equals HF vanilla's (outputs are kept from the first round)
            assert r["identical_to_hf"] == 3 and r["identical_checked"] == 3, r
    assert by_name["hf_vanilla"]["speedup_vs_hf"] == 1.0
    for name in ("none", "ngram", "layerskip"):  # overhead from runs alone, the lockstep figure kept too
        r = by_name[name]
        assert 0 < r["overhead_fraction"] < 1 and 0 < r["overhead_fraction_lockstep"] < 1, r
    assert report["interleave"] == "step"  # the default: methods in lockstep
    md = out_md.read_text()
    assert "hf_vanilla" in md and "the methods in lockstep" in md
    machine = report["machine"]  # the CPU and whether LightSpec's CPU kernels ran are recorded
    assert machine["cpu"] and machine["cpu_kernels"].split()[0] in ("on", "off")
    assert f"LightSpec CPU kernels {machine['cpu_kernels']}" in md


def test_cli_bench_batch_repeat_repeats_batched_runs_only(capsys, model_dir, tmp_path):
    """``--batch-repeat N`` runs batched configurations N times (their ratios are the
    noisiest: a workload is one batch); the report records both counts.  Also the
    ``--interleave batch`` mode (whole runs, one method after the other)."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat the cat\none two three one two three\n")
    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    rc, out, err = run_cli(["bench", "--model", model_dir, "--prompts", str(prompts), "--strategy", "none",
                            "--strategy", "ngram", "--max-new-tokens", "4", "--batch-size", "2", "--batch-repeat", "3",
                            "--interleave", "batch", "--json", str(out_json), "--markdown", str(out_md)], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    assert report["repeat"] == 1 and report["batch_repeat"] == 3 and report["interleave"] == "batch"
    (run,) = report["runs"]
    (w,) = run["workloads"].values()
    by_name = {r["name"]: r for r in w["results"]}
    assert set(by_name) == {"none", "ngram", "none (control)"}  # batched: a second `none` shows the spread
    for r in w["results"]:
        assert r["error"] is None and r["tokens"] == 3 * 2 * 4, r
        assert r["round_tokens"] == [2 * 4] * 3 and len(r["round_seconds"]) == 3
        if r["name"] != "none":  # the 95% interval of the paired rounds against `none`
            lo, hi = r["speedup_ci95"]
            assert 0 < lo <= hi
    md = out_md.read_text()
    assert "batched runs 3×" in md and "interleaved batch by batch" in md and "95% interval" in md
    rc, out, err = run_cli(["bench", "--model", model_dir, "--prompts", str(prompts), "--strategy", "none",
                            "--max-new-tokens", "2", "--batch-size", "2", "--no-control", "--json", str(out_json)], capsys)
    assert rc == 0, err
    (w,) = json.loads(out_json.read_text())["runs"][0]["workloads"].values()
    assert [r["name"] for r in w["results"]] == ["none"]
