"""``lightspec dspark train``: a tiny drafter trains for a few steps, writes checkpoints in the
public format, resumes exactly where it stopped (3 + 2 steps = 5 steps in one go, bit for bit),
reloads through the loader and drafts losslessly; the CLI command is registered and refuses bad
input with one line."""

from __future__ import annotations

import json

import click
import pytest
import torch
from dspark_fixtures import hf_greedy, tiny_target
from lightspec_dspark.checkpoint import load_drafter
from lightspec_dspark.train import TrainArgs, train
from safetensors.torch import load_file

from lightspec_core import InvalidValueError, MTPPipeline


class WordTok:
    """Words ``w3 .. w95`` -> ids 3..95 (0 pad, 1 bos, 2 eos)."""

    eos_token_id, pad_token_id, bos_token_id = 2, 0, 1
    all_special_ids = [0, 1, 2]

    def __call__(self, text):
        return {"input_ids": [int(w[1:]) for w in text.split() if w.startswith("w") and w[1:].isdigit() and 3 <= int(w[1:]) < 96]}

    def __len__(self):
        return 96

    def decode(self, ids, **_):
        return " ".join(f"w{i}" for i in ids)


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


def _args(tmp_path, out, steps, resume=False, stop_at=None):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        g = torch.Generator().manual_seed(0)
        corpus.write_text(" ".join(f"w{int(i)}" for i in torch.randint(3, 40, (600,), generator=g)))
    return TrainArgs(out=str(out), data=[str(corpus)], block_size=3, num_layers=1, intermediate_size=16, num_heads=4,
                     num_kv_heads=2, head_dim=8, target_layer_ids=[0, 2], markov_rank=4, prompt_len=8, gen_len=10,
                     sequences=12, batch_size=4, anchors=3, steps=steps, save_every=2, progress=False, resume=resume,
                     save_dtype="float32", lr=1e-2, stop_at=stop_at)


def test_train_checkpoint_resume_reload(tmp_path, target):
    straight = train(target, WordTok(), _args(tmp_path, tmp_path / "a", 5))
    assert straight["step"] == 5
    part = train(target, WordTok(), _args(tmp_path, tmp_path / "b", 5, stop_at=3))
    assert part["step"] == 3 and (tmp_path / "b" / "trainer_state.pt").is_file()
    first = load_file(str(tmp_path / "b" / "model.safetensors"))
    resumed = train(target, WordTok(), _args(tmp_path, tmp_path / "b", 5, resume=True))
    assert resumed["step"] == 5
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)  # resume = one uninterrupted run
    assert any(not torch.equal(first[k], b[k]) for k in a)  # and the resumed steps changed the weights
    assert "embed_tokens.weight" not in a and "lm_head.weight" not in a  # shared with the target
    log = json.loads((tmp_path / "b" / "training_log.json").read_text())
    assert log["steps"] == 5 and log["history"][-1]["step"] == 5 and "acc_per_slot" in log["history"][-1]
    # a shape that is not the checkpoint's is refused, naming the field and both values
    other = _args(tmp_path, tmp_path / "b", 6, resume=True)
    other.head_dim = 16
    with pytest.raises(InvalidValueError, match=r"--resume: the checkpoint's drafter has head_dim=8, --head-dim asks "
                                                r"for 16; leave --head-dim out to continue it"):
        train(target, WordTok(), other)
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["target_layer_ids"] == [0, 2] and cfg["block_size"] == 3
    d = load_drafter(tmp_path / "b", target)
    assert d.cfg.markov_rank == 4 and d.confidence_head is not None
    pipe = MTPPipeline(target, WordTok(), strategy="dspark", checkpoint=str(tmp_path / "b"))
    prompt = [5, 6, 7, 8, 9, 5, 6]
    out = pipe.generate([prompt], max_new_tokens=10, ignore_eos=True)[0]
    assert out.token_ids == hf_greedy(target, prompt, 10) and out.stats.drafted > 0


def test_training_lowers_the_loss(tmp_path, target):
    args = _args(tmp_path, tmp_path / "c", 30)
    args.save_every, args.cache_targets = 100, False  # the target runs every step (no cache)
    train(target, WordTok(), args)
    hist = json.loads((tmp_path / "c" / "training_log.json").read_text())["history"]
    assert hist[-1]["kl"] < 0.7 * hist[0]["kl"]


def test_resume_without_a_state_is_refused(tmp_path, target):
    with pytest.raises(FileNotFoundError, match="trainer_state.pt"):
        train(target, WordTok(), _args(tmp_path, tmp_path / "none", 2, resume=True))


def test_cli_command_is_registered_and_refuses_bad_input(tmp_path, capsys):
    from lightspec_dspark import plugin

    group = click.Group("lightspec")
    plugin.lightspec_register_commands(cli=group)
    assert "train" in group.commands["dspark"].commands
    from lightspec_core.cli import main

    assert main(["dspark", "train", "--help"]) == 0
    assert "--time-budget-s" in capsys.readouterr().out
    code = main(["dspark", "train", "--target", str(tmp_path), "--out", str(tmp_path / "o"), "--data", str(tmp_path), "--taps", "1,x"])
    err = capsys.readouterr().err
    assert code == 2 and "--taps" in err and "Traceback" not in err


def test_sequences_from_a_token_file_replace_generation(tmp_path, target):
    """--sequences-from: the records (sequence + end-of-text) of a token file are the data (none
    generated), end-of-text inside a sequence included; a file of another record length is refused."""
    import numpy as np
    from lightspec_dspark.train import read_sequences

    from lightspec_core import InvalidValueError

    g = torch.Generator().manual_seed(5)
    seqs = torch.randint(3, 96, (7, 18), generator=g)
    seqs[3, 5] = 2  # an end-of-text token inside a prompt (corpus windows cross documents)
    stream = torch.cat([seqs, torch.full((7, 1), 2)], 1).flatten().numpy().astype(np.uint16)
    stream.tofile(tmp_path / "onpolicy.bin")
    args = _args(tmp_path, tmp_path / "out", steps=2)
    args.sequences_from = str(tmp_path / "onpolicy.bin")
    got = read_sequences(args.sequences_from, args, 2)
    assert torch.equal(got, seqs)
    train(target, WordTok(), args)
    assert torch.equal(torch.load(tmp_path / "out" / "data.pt"), got)
    args.prompt_len = 9
    with pytest.raises(InvalidValueError, match=r"= 19 tokens each"):
        read_sequences(str(tmp_path / "onpolicy.bin"), args, 2)
