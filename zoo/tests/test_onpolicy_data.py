"""``zoo/scripts/make_onpolicy_data.py`` (the target's own continuations of training prompts) and
``zoo/scripts/eval_draft_acceptance.py`` (greedy chain acceptance), on a tiny random Llama."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from zoo_scripts import load_script

VOCAB, EOT = 64, 0



@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT)
    path = tmp_path_factory.mktemp("target")
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    return path


@pytest.fixture()
def source(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "src"
    src.mkdir()
    rng.integers(1, VOCAB, 4000).astype(np.uint16).tofile(src / "train.bin")
    rng.integers(1, VOCAB, 500).astype(np.uint16).tofile(src / "eval.bin")
    (src / "meta.json").write_text(json.dumps({"eval": {"tokens": 500}}))
    return src


def _run(target, source, out, tokens):
    load_script("make_onpolicy_data").main([
        "--target", str(target), "--source", str(source), "--out", str(out), "--prompt-len", "12",
        "--new-tokens", "5", "--batch-size", "3", "--sampled-every", "2", "--tokens", str(tokens),
        "--threads", "1"])
    return np.fromfile(out / "train.bin", dtype=np.uint16)


def test_sequences_are_training_windows_continued_by_the_target(tiny_target, source, tmp_path):
    from transformers import AutoModelForCausalLM

    seq_len = 12 + 5 + 1
    data = _run(tiny_target, source, tmp_path / "out", tokens=4 * 3 * seq_len)
    assert data.size == 4 * 3 * seq_len  # 4 batches of 3 sequences
    rows = data.reshape(-1, seq_len).astype(np.int64)
    assert (rows[:, -1] == EOT).all()
    stream = np.fromfile(source / "train.bin", dtype=np.uint16).astype(np.int64)
    windows = {tuple(stream[i:i + 12]) for i in range(stream.size - 11)}
    assert all(tuple(r[:12]) in windows for r in rows)
    # batches 0 and 2 are greedy (--sampled-every 2 samples batches 1 and 3): the target's own argmax
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    for i in [0, 1, 2, 6, 7, 8]:
        ids = torch.from_numpy(rows[i, :12])[None]
        with torch.no_grad():
            want = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False, top_k=None,
                                  top_p=None, pad_token_id=EOT, eos_token_id=None)[0, 12:]
        assert rows[i, 12:17].tolist() == want.tolist()
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["train"]["tokens"] == data.size and meta["train"]["sequences"] == 12
    assert (tmp_path / "out" / "eval.bin").read_bytes() == (source / "eval.bin").read_bytes()


def test_resume_appends_and_matches_one_run(tiny_target, source, tmp_path):
    seq_len = 18
    once = _run(tiny_target, source, tmp_path / "once", tokens=4 * 3 * seq_len)
    _run(tiny_target, source, tmp_path / "twice", tokens=2 * 3 * seq_len)
    with open(tmp_path / "twice" / "train.bin", "ab") as f:  # an interrupted write
        f.write(b"\x01\x00" * 7)
    twice = _run(tiny_target, source, tmp_path / "twice", tokens=4 * 3 * seq_len)
    # greedy batches match exactly; sampled ones are seeded per batch
    assert twice.tolist() == once.tolist()


def test_chain_matches_counts_the_drafts_greedy_prefix(tiny_target):
    from transformers import AutoModelForCausalLM

    ev = load_script("eval_draft_acceptance")
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    ctx = torch.randint(1, VOCAB, (10,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        chain = model.generate(ctx[None], max_new_tokens=6, min_new_tokens=6, do_sample=False, top_k=None,
                               top_p=None, pad_token_id=EOT, eos_token_id=None)[0, 10:]
    assert ev.chain_matches(model, ctx, chain, k=4) == 4
    assert ev.chain_matches(model, ctx, chain[:2], k=4) == 2
    wrong = chain.clone()
    wrong[2] = (wrong[2] + 1) % VOCAB
    assert ev.chain_matches(model, ctx, wrong, k=6) == 2
    wrong[0] = (wrong[0] + 1) % VOCAB
    assert ev.chain_matches(model, ctx, wrong, k=6) == 0
