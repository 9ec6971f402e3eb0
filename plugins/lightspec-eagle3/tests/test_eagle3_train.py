"""``lightspec eagle3 train``: a tiny head trains a few steps, checkpoints in the public
format, resumes where it stopped and reloads through the loader; bad arguments are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from e3_fixtures import tiny_target
from lightspec_eagle3.checkpoint import load_head
from lightspec_eagle3.data import draft_vocabulary
from lightspec_eagle3.train import TrainArgs, train
from safetensors.torch import load_file

from lightspec_core import InvalidValueError


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from test_eagle3_drafter import _save_tokenizer

    folder = tmp_path_factory.mktemp("target")
    tiny_target().save_pretrained(folder)
    _save_tokenizer(folder)
    text = folder / "text"
    text.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        (text / f"doc{i}.txt").write_text(" ".join(f"w{int(x)}" for x in rng.integers(3, 40, 400)))
    (text / "skip.txt").write_text("w90 " * 1000)
    return folder


def test_train_checkpoint_resume_reload(target_dir, tmp_path):
    from lightspec_core.cli import cli

    out = tmp_path / "head"
    base = ["eagle3", "train", "--target", str(target_dir), "--data", str(target_dir / "text"), "--exclude", "skip.txt",
            "--out", str(out), "--draft-vocab", "40", "--intermediate-size", "32", "--heads", "2", "--kv-heads", "1",
            "--seq-len", "24", "--batch", "4", "--ttt-steps", "2", "--seed", "3"]
    r = CliRunner().invoke(cli, base + ["--max-steps", "3", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{"):])
    assert summary["steps"] == 3 and summary["tokens"] == 3 * 4 * 24
    logged = json.loads((out / "training_log.json").read_text())["log"]
    assert [e["step"] for e in logged] == [1, 3]  # every 10th step, the first and the last
    state = load_file(str(out / "model.safetensors"))
    assert state["fc.weight"].dtype == torch.float16 and "midlayer.self_attn.q_proj.weight" in state
    ids = torch.arange(40) + state["d2t"]
    assert 90 not in ids.tolist()  # the excluded file's token is not in the draft vocabulary
    first = load_head(out, tiny_target())
    r = CliRunner().invoke(cli, base + ["--max-steps", "5", "--resume"])
    assert r.exit_code == 0, r.output
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] == 5 and log["tokens"] == 5 * 4 * 24
    assert [e["step"] for e in log["log"]] == [1, 3, 5]
    resumed = load_head(out, tiny_target())
    assert not torch.equal(first.fc.weight, resumed.fc.weight)  # the resumed steps trained
    # a shape that is not the checkpoint's is refused, naming the field and both values
    r = CliRunner().invoke(cli, [*base[:base.index("--draft-vocab")], "--draft-vocab", "30",
                                 *base[base.index("--draft-vocab") + 2:], "--max-steps", "6", "--resume"])
    assert r.exit_code != 0 and "--resume: the checkpoint's head has draft_vocab_size=40, --draft-vocab asks for 30" \
        in str(r.exception), r.output
    assert torch.equal(first.d2t, resumed.d2t)
    # resuming reproduces an uninterrupted run (same batches, same optimizer state)
    whole = tmp_path / "whole"
    r = CliRunner().invoke(cli, [*base[:base.index("--out")], "--out", str(whole), *base[base.index("--out") + 2:],
                                 "--max-steps", "5"])
    assert r.exit_code == 0, r.output
    torch.testing.assert_close(load_head(whole, tiny_target()).fc.weight, resumed.fc.weight, atol=1e-3, rtol=0)


def test_loss_falls(target_dir, tmp_path):
    s = train(TrainArgs(target=str(target_dir), data=[str(target_dir / "text")], out=str(tmp_path / "h"),
                        intermediate_size=32, seq_len=24, batch=8, ttt_steps=2, max_steps=40, lr=3e-3), progress=False)
    assert s["log"][-1]["loss"] < 0.8 * s["log"][0]["loss"]


@pytest.mark.parametrize("kw, match", [
    (dict(), "--max-steps N or --time-budget-s"),
    (dict(max_steps=1, share_lm_head=True, draft_vocab=10), "--share-lm-head needs the whole vocabulary"),
    (dict(max_steps=1, device="tpu"), "--device='tpu'"),
    (dict(max_steps=1, seq_len=2), "--seq-len=2"),
])
def test_bad_arguments_refused(target_dir, tmp_path, kw, match):
    with pytest.raises(InvalidValueError, match=match):
        train(TrainArgs(target=str(target_dir), data=[str(target_dir / "text")], out=str(tmp_path / "h"), **kw))


def test_resume_without_state_and_missing_data(target_dir, tmp_path):
    with pytest.raises(InvalidValueError, match="--resume"):
        train(TrainArgs(target=str(target_dir), data=[str(target_dir / "text")], out=str(tmp_path / "h"), max_steps=1,
                        resume=True))
    with pytest.raises(InvalidValueError, match="no such file"):
        train(TrainArgs(target=str(target_dir), data=[str(tmp_path / "nope")], out=str(tmp_path / "h"), max_steps=1))


def test_draft_vocabulary_is_most_frequent_ascending():
    tokens = np.array([5, 5, 5, 1, 1, 7, 9, 9, 9, 9])
    assert draft_vocabulary(tokens, 10, 3).tolist() == [1, 5, 9]
    with pytest.raises(InvalidValueError, match="draft vocabulary size 11"):
        draft_vocabulary(tokens, 10, 11)


def test_shrink_vocab_command(target_dir, tmp_path, capsys):
    """``lightspec eagle3 shrink-vocab`` restricts a trained head to the most frequent tokens of
    --data; a bad size is one clear error without a traceback."""
    from lightspec_core.cli import cli

    head = tmp_path / "head"
    train(TrainArgs(target=str(target_dir), data=[str(target_dir / "text")], out=str(head), intermediate_size=32,
                    heads=2, kv_heads=1, seq_len=24, batch=4, ttt_steps=2, max_steps=2, share_lm_head=True),
          progress=False)
    base = ["eagle3", "shrink-vocab", "--head", str(head), "--target", str(target_dir),
            "--data", str(target_dir / "text")]
    r = CliRunner().invoke(cli, base + ["--draft-vocab", "20", "--out", str(tmp_path / "small"), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{"):])
    assert summary["draft_vocab_size"] == 20 and summary["was"] == 96 and 0.5 < summary["coverage"] < 1
    small = load_head(tmp_path / "small", tiny_target())
    assert small.lm_head is None and small.target_ids().tolist() == sorted(small.target_ids().tolist())
    kept = set(small.target_ids().tolist())
    assert 90 in kept and kept <= set(range(3, 40)) | {2, 90}  # skip.txt's w90 is the most frequent word
    from lightspec_core.cli import main

    capsys.readouterr()
    rc = main(base + ["--draft-vocab", "96", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --draft-vocab 96 is invalid: use 1..95 (fewer tokens than the head's draft vocabulary of 96)"]


@pytest.mark.parametrize("arch, width", [("gpt2", 4 * 64), ("opt", 128)])
def test_a_head_trains_for_targets_that_name_their_mlp_width_otherwise(tmp_path, arch, width):
    """GPT-2 leaves its MLP width implicit (``n_inner`` None: 4 H) and OPT calls it ``ffn_dim``;
    the trainer read ``intermediate_size`` and failed with an AttributeError on both."""
    from helpers import WORDS, hf_reference, save_tiny
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightspec_core import MTPPipeline

    folder = save_tiny(tmp_path / arch, arch=arch)
    text = tmp_path / "text.txt"
    rng = np.random.default_rng(0)
    text.write_text(" ".join(WORDS[int(i)] for i in rng.integers(0, 40, 3000)))
    train(TrainArgs(target=str(folder), data=[str(text)], out=str(tmp_path / "head"), seq_len=24, batch=2, ttt_steps=2,
                    max_steps=3), progress=False)
    assert json.loads((tmp_path / "head" / "config.json").read_text())["intermediate_size"] == width
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    pipe = MTPPipeline(model, tok, strategy="eagle3", head=str(tmp_path / "head"), budget={"type": "static", "k": 3})
    prompts = ["the cat the cat one two three", "def x ( ) : return x"]
    outs = pipe.generate(prompts, max_new_tokens=10, ignore_eos=True)
    assert [o.token_ids for o in outs] == [hf_reference(model, tok, p, 10) for p in prompts]
    assert sum(o.stats.drafted for o in outs) > 0
