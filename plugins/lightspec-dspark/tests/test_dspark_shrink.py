"""``lightspec dspark shrink-vocab``: a drafter restricted to its most frequent tokens keeps its
logits over them exactly, stays lossless, keeps a shared ``lm_head`` shared (``d2t`` only), and
the loader refuses a ``d2t`` that does not fit the target."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dspark_fixtures import ToyTok, hf_greedy, prompts, tiny_target, write_checkpoint
from lightspec_dspark.checkpoint import load_drafter
from lightspec_dspark.config import CheckpointError
from lightspec_dspark.model import SharedRows
from lightspec_dspark.shrink import frequent_tokens, shrink_vocab
from safetensors.torch import load_file

from lightspec_core import InvalidValueError, MTPPipeline


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")




def _logits(d, target, seed=0):
    """Each slot's draft logits (Markov bias of the slot's previous token included) for random
    hidden states ``[2, 3, H]``, as ``{target id: logit}`` per slot."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2, 3, d.cfg.hidden_size, generator=g)
    prev = torch.randint(3, 90, (2, 3), generator=g)
    with torch.inference_mode():
        out = d.base_logits(h) + d.markov_head.step(prev, h, None)[0]
    ids = d.to_target_ids(torch.arange(d.cfg.out_vocab))
    return out, ids


@pytest.mark.parametrize("own_head", [False, True], ids=["shared_lm_head", "own_lm_head"])
def test_kept_tokens_keep_their_logits_and_decoding_stays_lossless(tmp_path, target, own_head):
    src = write_checkpoint(tmp_path / "src", target, **({"draft_vocab": 80} if own_head else {}))
    full = load_drafter(src, target)
    allowed = full.to_target_ids(torch.arange(full.cfg.out_vocab)).tolist()
    often = allowed[2], allowed[30], allowed[50]  # tokens the drafter can draft, made the most frequent
    tokens = np.array(list(often) * 50 + list(range(3, 96)))
    summary = shrink_vocab(src, target, tokens, 24, tmp_path / "small")
    assert summary["draft_vocab_size"] == 24 and summary["was"] == full.cfg.out_vocab
    small = load_drafter(tmp_path / "small", target)
    assert small.cfg.out_vocab == 24 and json.loads((tmp_path / "small" / "config.json").read_text())["draft_vocab_size"] == 24
    written = load_file(str(tmp_path / "small" / "model.safetensors"))
    assert ("lm_head.weight" in written) == own_head  # a shared lm_head stays shared: d2t only
    assert isinstance(small.lm_head, SharedRows) != own_head
    kept = small.to_target_ids(torch.arange(24))
    assert set(often) <= set(kept.tolist()) <= set(allowed)  # the most frequent tokens are kept
    big, big_ids = _logits(full, target)
    lo, lo_ids = _logits(small, target)
    where = torch.searchsorted(big_ids, lo_ids)
    torch.testing.assert_close(lo, big[..., where], atol=2e-3, rtol=2e-3)  # float16 on disk, as the source
    pipe = MTPPipeline(target, ToyTok(), strategy="dspark", checkpoint=str(tmp_path / "small"),
                       budget={"type": "static", "k": 4})
    ps = prompts(4, seed=5)
    out = pipe.generate(ps, max_new_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in out] == [hf_greedy(target, p, 12) for p in ps]
    assert sum(o.stats.drafted for o in out) > 0 and not any(o.stats.failures for o in out)


def test_bad_sizes_and_a_d2t_beyond_the_target_are_refused(tmp_path, target):
    src = write_checkpoint(tmp_path / "src", target)
    with pytest.raises(InvalidValueError, match="--draft-vocab 96 is invalid: use 1..95"):
        shrink_vocab(src, target, np.arange(96), 96, tmp_path / "x")
    shrink_vocab(src, target, np.arange(96), 10, tmp_path / "small")
    from safetensors.torch import save_file

    st = load_file(str(tmp_path / "small" / "model.safetensors"))
    st["d2t"] = st["d2t"] + 200
    save_file(st, str(tmp_path / "small" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="'d2t' maps draft ids to target ids .*96 rows"):
        load_drafter(tmp_path / "small", target)


def test_frequent_tokens_only_among_the_allowed_ids():
    tokens = np.array([7, 7, 7, 3, 3, 1])
    assert frequent_tokens(tokens, 10, 2).tolist() == [3, 7]
    assert frequent_tokens(tokens, 10, 2, allowed=np.array([1, 3, 8])).tolist() == [1, 3]
    assert frequent_tokens(tokens, 10, 3, allowed=np.array([1, 3, 8])).tolist() == [1, 3, 8]
