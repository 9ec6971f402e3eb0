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
