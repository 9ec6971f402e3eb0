"""Restricting a trained head to a reduced draft vocabulary (``lightspec eagle3 shrink-vocab``):
the kept tokens' logits are the head's own, the result loads in the public layout (with its
own ``lm_head`` rows sliced, or sharing the target's rows), drafting with it stays lossless,
and bad sizes get one clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from e3_fixtures import VOCAB, random_head, tiny_target, write_layout
from lightspec_eagle3.checkpoint import load_head
from lightspec_eagle3.drafter import Eagle3Drafter
from lightspec_eagle3.shrink import shrink_head, shrink_vocab
from models import ToyTokenizer
from safetensors.torch import load_file, save_file

from lightspec_core import InvalidValueError, MTPPipeline


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _shared_full_head(tmp_path, target):
    """A whole-vocabulary head without an lm_head of its own (as the zoo ships its head)."""
    folder = write_layout(tmp_path / "full", random_head(target, "full_vocab"), "full_vocab")
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("shared", [False, True])
def test_kept_tokens_keep_their_logits_and_the_head_round_trips(tmp_path, target, shared):
    folder = _shared_full_head(tmp_path, target) if shared else write_layout(
        tmp_path / "own", random_head(target, "full_vocab"), "full_vocab")
    head = load_head(folder, target)
    ids = np.array([3, 7, 8, 20, 50, 95])
    small = shrink_head(head, ids)
    assert small.cfg.draft_vocab_size == 6 and (small.lm_head is None) == shared
    assert small.target_ids().tolist() == ids.tolist() and int(small.t2d.sum()) == 6
    h = torch.randn(5, head.cfg.hidden_size)
    torch.testing.assert_close(small.draft_logits(h), head.draft_logits(h)[:, ids])
    from lightspec_eagle3.checkpoint import save_head

    out = save_head(small, tmp_path / "small", dtype=torch.float32)
    saved = load_file(str(out / "model.safetensors"))
    assert ("lm_head.weight" in saved) != shared and saved["d2t"].tolist() == (ids - np.arange(6)).tolist()
    again = load_head(out, target)
    torch.testing.assert_close(again.draft_logits(h), head.draft_logits(h)[:, ids])
    # a reduced head shrinks further, to a subset of its own vocabulary only
    smaller = shrink_head(again, np.array([7, 50]))
    torch.testing.assert_close(smaller.draft_logits(h), head.draft_logits(h)[:, [7, 50]])
    with pytest.raises(InvalidValueError, match="subset of the head's own draft vocabulary"):
        shrink_head(again, np.array([4, 7]))
    with pytest.raises(InvalidValueError, match="ascending list of distinct token ids"):
        shrink_head(again, np.array([50, 7]))


def test_shrink_vocab_keeps_the_most_frequent_tokens(tmp_path, target):
    folder = _shared_full_head(tmp_path, target)
    tokens = np.array([5] * 9 + [9] * 7 + [70] * 5 + [4] * 2 + [6])
    summary = shrink_vocab(folder, target, tokens, 3, tmp_path / "s3")
    assert summary["draft_vocab_size"] == 3 and summary["was"] == VOCAB
    assert summary["coverage"] == round(21 / 24, 4)
    assert load_head(tmp_path / "s3", target).target_ids().tolist() == [5, 9, 70]
    for bad in (0, VOCAB):
        with pytest.raises(InvalidValueError, match=f"--draft-vocab {bad} is invalid: use 1..{VOCAB - 1}"):
            shrink_vocab(folder, target, tokens, bad, tmp_path / "bad")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafting_with_a_shrunk_head_is_lossless(tmp_path, target, temperature):
    folder = _shared_full_head(tmp_path, target)
    # the head's own greedy choices on these prompts, so that the small vocabulary drafts often
    ids = np.arange(3, 60)
    shrink_vocab(folder, target, ids, 40, tmp_path / "small")
    prompts = [[5, 17, 33, 5, 17, 33], [9, 8, 7], [40, 41, 42, 43]]
    plain = MTPPipeline(target, ToyTokenizer(VOCAB), strategy="none")
    spec = MTPPipeline(target, ToyTokenizer(VOCAB), strategy=Eagle3Drafter(head=str(tmp_path / "small"), max_draft=3),
                       budget={"type": "static", "k": 3})
    kw = dict(max_new_tokens=12, ignore_eos=True, temperature=temperature)
    seeds = [11, 12, 13] if temperature else None
    want = [o.token_ids for o in plain.generate(prompts, seed=seeds, **kw)]
    outs = spec.generate(prompts, seed=seeds, **kw)
    assert sum(o.stats.drafted for o in outs) > 0
    drafted = spec.strategy.draft_ids.tolist()
    assert len(drafted) == 40 and set(drafted) <= set(range(3, 60))
    if temperature == 0.0:
        assert [o.token_ids for o in outs] == want
