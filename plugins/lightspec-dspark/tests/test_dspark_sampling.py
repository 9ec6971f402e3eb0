"""Sampling with ``dspark`` (draft probabilities with the Markov bias, warped) and with
``adaptive`` around it keeps the target's distribution: the output tokens of many seeded rows
match plain sampling's (two-sample chi-square per position and per pair of positions), and the
check has power (it rejects another temperature)."""

from __future__ import annotations

import pytest
from dspark_fixtures import tiny_target, write_checkpoint
from stat_tests import two_sample_p

from lightspec_core import MTPPipeline

SAMPLING = dict(temperature=0.9, top_k=12, top_p=0.95)
ROWS, NEW, VOCAB = 800, 4, 64


class _Tok:
    eos_token_id, pad_token_id, bos_token_id = 2, 0, 1
    all_special_ids = [0, 1, 2]

    def __len__(self):
        return VOCAB

    def decode(self, ids, **_):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target = tiny_target("llama", vocab=VOCAB, layers=2)
    ckpt = write_checkpoint(tmp_path_factory.mktemp("ck"), target, taps=(0, 1), scale=0.2)
    prompt = [5, 9, 14, 22, 5, 9, 30]
    plain = MTPPipeline(target, _Tok(), strategy="none")

    def run(pipe, seeds, chunk=None, **kw):
        """Rows in batches of ``chunk`` (adaptive verification does not draft for 800 rows at once)."""
        chunk = chunk or len(seeds)
        out = []
        for i in range(0, len(seeds), chunk):
            part = seeds[i : i + chunk]
            out += pipe.generate([prompt] * len(part), max_new_tokens=NEW, seed=part, ignore_eos=True, **{**SAMPLING, **kw})
        return [tuple(o.token_ids) for o in out], out

    base, _ = run(plain, list(range(ROWS)))
    return target, ckpt, plain, base, run


@pytest.mark.parametrize("strategy", ["dspark", "adaptive"])
def test_sampling_keeps_the_distribution(setup, strategy):
    target, ckpt, plain, base, run = setup
    opts = {"checkpoint": str(ckpt)} if strategy == "dspark" else {"drafter": "dspark", "options": {"checkpoint": str(ckpt)}}
    pipe = MTPPipeline(target, _Tok(), strategy=strategy, budget={"type": "static", "k": 3}, **opts)
    spec, out = run(pipe, list(range(10_000, 10_000 + ROWS)), chunk=16 if strategy == "adaptive" else None)
    drafted, accepted = sum(o.stats.drafted for o in out), sum(o.stats.accepted for o in out)
    assert drafted > ROWS / 2 and 0 < accepted < drafted, (drafted, accepted)
    for pos in range(1, NEW):
        assert two_sample_p([s[pos] for s in base], [s[pos] for s in spec]) > 1e-3, pos
    for a in range(NEW - 1):
        assert two_sample_p([s[a:a + 2] for s in base], [s[a:a + 2] for s in spec]) > 1e-3, a


def test_the_check_has_power(setup):
    target, ckpt, plain, base, run = setup
    other, _ = run(plain, list(range(20_000, 20_000 + ROWS)), temperature=1.4)
    assert min(two_sample_p([s[a:a + 2] for s in base], [s[a:a + 2] for s in other]) for a in range(NEW - 1)) < 1e-3
