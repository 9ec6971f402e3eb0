"""``lightspec mtplayer train``: trains a tiny head of either kind a few steps, checkpoints,
resumes exactly where it stopped (same weights as an uninterrupted run), and the result loads
back through the ``mtp`` strategy with greedy output identical to HF."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from fixtures import VOCAB, build_target, hf_greedy, tiny_tokenizer
from lightspec_core.cli import cli, main
from safetensors.torch import load_file

from lightspec_core import MTPPipeline


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target = build_target("llama")
    target.save_pretrained(root / "target")
    tiny_tokenizer().save_pretrained(root / "target")
    rng = np.random.default_rng(0)
    # a learnable stream: short repeated phrases
    phrases = [rng.integers(4, VOCAB, size=rng.integers(3, 7)) for _ in range(12)]
    ids = np.concatenate([phrases[i] for i in rng.integers(0, 12, size=400)]).astype(np.uint16)
    ids.tofile(root / "train.bin")
    return root


def _train(root, out, kind, *extra):
    args = ["mtplayer", "train", "--target", str(root / "target"), "--kind", kind, "--out", str(out), "--data",
            str(root / "train.bin"), "--seq-len", "24", "--batch", "2", "--heads", "2", "--save-every", "2",
            "--save-dtype", "float32", "--threads", "1", "--lr", "1e-2", "--warmup", "1", "--log-every", "1", "--json",
            *extra]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


@pytest.mark.parametrize("kind", ["mtp", "medusa"])
def test_train_resume_reload(setup, tmp_path, kind):
    root = setup
    whole = _train(root, tmp_path / "whole", kind, "--max-steps", "4")
    assert whole["steps"] == 4 and whole["stopped"] == "max_steps" and whole["tokens"] == 4 * 2 * 24
    # the same run, stopped by its time budget after its first step, then resumed
    first = _train(root, tmp_path / "split", kind, "--max-steps", "4", "--time-budget-s", "0.0001")
    assert first["stopped"] == "time_budget" and 1 <= first["steps"] < 4
    again = _train(root, tmp_path / "split", kind, "--max-steps", "4", "--resume")
    assert again["steps"] == 4
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    # training changed the head (it is not the initialisation saved as is)
    log = json.loads((tmp_path / "split" / "training_log.json").read_text())
    assert log["steps"] == 4 and log["kind"] == kind and log["train"][-1]["loss"] < log["train"][0]["loss"]
    cfg = json.loads((tmp_path / "split" / "config.json").read_text())
    if kind == "mtp":
        assert cfg["num_nextn_predict_layers"] == 1 and all(k.startswith("model.layers.2.") for k in a)
        assert "model.layers.2.shared_head.head.weight" not in a  # shared with the target by default
    else:
        assert cfg["medusa_num_heads"] == 2 and cfg["lightspec_shared_lm_head"] is True
    # it loads back through the strategy, and the output is the target's
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(root / "target", dtype=torch.float32).eval()
    pipe = MTPPipeline(target, tiny_tokenizer(), strategy="mtp", head=str(tmp_path / "split"),
                       budget={"type": "static", "k": 3})
    prompts = [[5, 6, 7, 8], [9, 10]]
    outs = pipe.generate(prompts, max_new_tokens=10, ignore_eos=True)
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(target, p, 10)
    assert sum(o.stats.drafted for o in outs) > 0


def _error(capsys, args) -> str:
    """Run the CLI as a user does; return its one error line (and check there is no traceback)."""
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error:")][0]


def test_the_log_ends_with_the_last_step(setup, tmp_path):
    _train(setup, tmp_path / "h", "medusa", "--max-steps", "4", "--log-every", "3")
    log = json.loads((tmp_path / "h" / "training_log.json").read_text())
    assert [e["step"] for e in log["train"]] == [1, 3, 4]  # every 3rd step, the first and the last


def test_resume_refuses_another_kind(setup, tmp_path, capsys):
    _train(setup, tmp_path / "h", "medusa", "--max-steps", "1")
    line = _error(capsys, ["mtplayer", "train", "--target", str(setup / "target"), "--kind", "mtp", "--out",
                           str(tmp_path / "h"), "--data", str(setup / "train.bin"), "--resume"])
    assert "the checkpoint was trained with kind='medusa', this run asks for 'mtp'" in line


def test_bad_data_is_one_clear_error(setup, tmp_path, capsys):
    line = _error(capsys, ["mtplayer", "train", "--target", str(setup / "target"), "--out", str(tmp_path),
                           "--data", str(tmp_path / "nothing.bin")])
    assert "nothing.bin: no such file" in line
    np.full(100, VOCAB + 5, dtype=np.uint16).tofile(tmp_path / "big.bin")
    line = _error(capsys, ["mtplayer", "train", "--target", str(setup / "target"), "--out", str(tmp_path),
                           "--data", str(tmp_path / "big.bin"), "--seq-len", "16"])
    assert f"token id {VOCAB + 5}, outside the target's vocabulary (0..{VOCAB - 1})" in line
    line = _error(capsys, ["mtplayer", "train", "--target", str(setup / "target"), "--out", str(tmp_path),
                           "--data", str(setup / "train.bin"), "--heads", "0", "--kind", "medusa"])
    assert "heads=0 is invalid: use an integer >= 1" in line


def test_mtp_modules_train_for_gpt_neox_and_are_refused_where_blocks_cannot_make_them(tmp_path, capsys):
    """GPT-NeoX blocks take their cache as ``layer_past`` and keep their attention under
    ``attention``: MTP modules train and draft losslessly there.  GPT-2 and OPT have no rotary
    positions and no ``input_layernorm``: one error line that names Medusa heads, where
    training used to stop with an AttributeError."""
    from helpers import hf_reference, save_tiny
    from transformers import AutoModelForCausalLM

    rng = np.random.default_rng(0)
    rng.integers(4, 96, size=3000).astype(np.uint16).tofile(tmp_path / "train.bin")
    common = ["--kind", "mtp", "--data", str(tmp_path / "train.bin"), "--seq-len", "24", "--batch", "2",
              "--max-steps", "2", "--threads", "1", "--save-dtype", "float32"]
    neox = save_tiny(tmp_path / "neox", arch="gpt_neox")
    res = CliRunner().invoke(cli, ["mtplayer", "train", "--target", str(neox), "--out", str(tmp_path / "m"), *common])
    assert res.exit_code == 0, res.output
    model = AutoModelForCausalLM.from_pretrained(neox, dtype=torch.float32).eval()
    tok = tiny_tokenizer()
    pipe = MTPPipeline(model, tok, strategy="mtp", head=str(tmp_path / "m"), budget={"type": "static", "k": 3})
    prompts = [[5, 9, 13, 5, 9], [20, 21, 22, 23]]
    outs = pipe.generate(prompts, max_new_tokens=10, ignore_eos=True)
    assert [o.token_ids for o in outs] == [hf_reference(model, tok, p, 10) for p in prompts]
    assert sum(o.stats.drafted for o in outs) > 0
    for arch in ("gpt2", "opt"):
        folder = save_tiny(tmp_path / arch, arch=arch)
        capsys.readouterr()
        assert main(["mtplayer", "train", "--target", str(folder), "--out", str(tmp_path / f"x-{arch}"), *common]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and "MTP modules need a target with rotary positions" in err[0], err
        assert "--kind medusa" in err[0] and "Traceback" not in err[0]
