"""A seeded request's text does not depend on its batch, nor on what the pipeline ran before,
for the model drafters on the zoo models with the suite's long prompts (float32, the CPU
kernels: the target's logits are batch-invariant there; the user guide's promise).

Three ways it broke, each fixed:

* ``draft_model`` fed its draft the last ``batch_context / batch`` prompt tokens (32 at batch 8,
  128 alone), so a row drafted from another context in a batch; sampled rows now start at
  ``max_context`` before their own prompt's end (``StepContext.prompt_lengths``).
* DSpark drafted a block as wide as the batch's widest limit, and the block's slots attend to
  each other: near the end of a generation (or under the dynamic budget) a row's draft
  changed with its neighbours' limits; a sampled row's slots now see only its own limit's.
* The dynamic budget learned seeded rows' per-source acceptance only for the drafters whose
  cost it had measured so far (none at the first steps of a fresh pipeline, more after earlier
  runs or other rows' drafts); it now learns them for the strategy's structural sources.

The toy-model version of the batch check (short prompts, where none of this shows) is in
``test_sampling_distribution.py``.
"""

from __future__ import annotations

import functools

import pytest
import torch

import lightspec_zoo
from lightspec_core import MTPPipeline

KW = dict(max_new_tokens=32, temperature=0.8, ignore_eos=True)
SEEDS = list(range(8))


@functools.lru_cache(maxsize=None)
def _zoo():
    from lightspec_core.loading import load_model, load_tokenizer

    path = str(lightspec_zoo.model_path())
    return load_model(path, torch.device("cpu"), torch.float32), load_tokenizer(path)


def _prompts() -> list[str]:
    sets = lightspec_zoo.prompt_sets()
    return [p for w in ("code", "docstring", "edit", "prose") for p in sets[w][:2]]  # 100-400 tokens each


def _union_file() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "union.yaml")


@pytest.mark.parametrize("strategy", ["draft_model", "dspark", "hybrid", "union"])
def test_a_seeded_request_gets_the_same_text_alone_in_a_batch_and_after_other_runs(strategy):
    model, tok = _zoo()
    spec = _union_file() if strategy == "union" else strategy

    def pipe():
        return MTPPipeline(model, tok, strategy=spec, draft_model=str(lightspec_zoo.model_path("draft")))

    prompts = _prompts()
    fresh = pipe()
    together = fresh.generate(prompts, seed=SEEDS, **KW)
    assert sum(o.stats.accepted for o in together) > 0  # drafts were verified, not only made
    assert not any(o.stats.failures for o in together)
    again = fresh.generate(prompts, seed=SEEDS, **KW)  # the same pipeline, after a run
    assert [o.token_ids for o in again] == [o.token_ids for o in together]
    solo = pipe()  # one pipeline for the requests alone: the later ones run after the earlier ones
    for i, (prompt, seed) in enumerate(zip(prompts, SEEDS)):
        alone = solo.generate([prompt], seed=[seed], **KW)[0]
        assert alone.token_ids == together[i].token_ids, f"row {i}"


@pytest.mark.parametrize("strategy", ["draft_model", "dspark"])
def test_a_seeded_request_joining_a_running_batch_gets_its_text_alone(strategy):
    """Continuous batching (the server's ``EngineSession``): a request that joins a batch
    mid-way, while others join and leave, samples what it samples alone.  A joining row
    rebuilds ``draft_model``'s cache for every row; a sampled row's context still starts
    from its own prompt (with the batch's cut, this failed).  DSpark keeps a context store
    per request, which joins and departures must leave alone."""
    from lightspec_core.engine_session import EngineSession
    from lightspec_core.sampling import SamplingParams

    model, tok = _zoo()
    sets = lightspec_zoo.prompt_sets()
    prompts = [tok(p).input_ids for p in (sets["edit"][1], sets["prose"][3], sets["edit"][0])]  # 210-265 tokens
    sampling = SamplingParams(temperature=0.8)

    def pipe():
        return MTPPipeline(model, tok, strategy=strategy, draft_model=str(lightspec_zoo.model_path("draft")))

    alone = EngineSession(pipe().engine, sampling, eos_ids=set())
    want = alone.add(0, prompts[0], 32, seed=42).tokens
    while alone.requests:
        want += [t for o in alone.step() for t in o.tokens]
    shared = EngineSession(pipe().engine, sampling, eos_ids=set())
    shared.add(5, prompts[1], 32, seed=1)
    for _ in range(3):
        shared.step()
    got = shared.add(6, prompts[0], 32, seed=42).tokens
    shared.add(7, prompts[2], 6, seed=3)  # leaves early
    joined = False
    while shared.requests:
        got += [t for o in shared.step() if o.request == 6 for t in o.tokens]
        if not joined and 7 not in shared.requests:
            shared.add(8, prompts[1], 8, seed=4)  # another joins after one left
            joined = True
    assert got == want
