"""Sampling keeps the target distribution.  (Over 400 lines: the synthetic and the end-to-end
distribution tests share their statistics helpers.)

* ``verify_chain`` on synthetic distributions, in the spirit of vLLM's
  ``test_rejection_sampling_approximates_target_distribution``: as the number of samples
  grows, the distance of the output histogram to the target shrinks at least 20x faster
  than its distance to random reference distributions — for drafters with
  probabilities and for drafters without (n-gram style, verified as one-hot).
* End to end through the pipeline on a tiny model with temperature/top-k/top-p/min-p:
  speculative sampling produces the same token distribution as plain sampling.
* Seeded runs are reproducible; ``warp_logits`` equals HF's warpers.
"""

from __future__ import annotations

import copy

import pytest
import torch
from lightspec_core.interfaces import DraftProposal, RowHistory, StepContext
from lightspec_core.sampling import (
    SamplingParams,
    exponential_noise,
    row_uniforms,
    sample_inverse_cdf,
    warp_logits,
    warped_probs,
)
from lightspec_core.verify import verify_chain
from models import ToyTokenizer, build_model, cached_model
from stat_tests import chi2_sf, two_sample_chi2

from lightspec_core import MTPPipeline

VOCAB = 10
K = 2
SIZES = [10, 100, 1_000, 10_000, 100_000]
N_REF = 100


def make_ctx(batch: int, sampling: SamplingParams, seed: int) -> StepContext:
    g = torch.Generator().manual_seed(seed)
    return StepContext(
        step=1,
        sequences=[[0]] * batch,
        row_ids=list(range(batch)),
        max_draft=torch.full((batch,), K),
        max_draft_list=[K] * batch,
        min_confidence=torch.zeros(batch),
        sampling=sampling,
        generators=[g] * batch,  # one stream shared by all rows: independent draws
        history=[RowHistory() for _ in range(batch)],
        target=None,
        tokenizer=None,
        device=torch.device("cpu"),
        vocab_size=VOCAB,
    )


def sample_outputs(n, target_logits, draft_dist, with_probs, sampling, seed):
    """Run verify_chain over n rows; return the non-bonus emitted tokens (1-D)."""
    gen = torch.Generator().manual_seed(seed + 1)
    drafts = torch.multinomial(draft_dist, n * K, replacement=True, generator=gen).view(n, K)
    probs = draft_dist.expand(n, K, VOCAB).contiguous() if with_probs else None
    proposal = DraftProposal(tokens=drafts, lengths=torch.full((n,), K), probs=probs, source="test")
    logits = target_logits.expand(n, K + 1, VOCAB).contiguous()
    result = verify_chain(make_ctx(n, sampling, seed), proposal, logits)
    assert result.emitted.shape == (n, K + 1)
    acc = result.accepted
    assert bool(((acc >= 0) & (acc <= K)).all())
    # accepted drafts are emitted unchanged
    pos = torch.arange(K)
    kept = pos[None, :] < acc[:, None]
    assert torch.equal(result.emitted[:, :K][kept], drafts[kept])
    # exactly accepted + 1 tokens, then -1
    n_emitted = (result.emitted >= 0).sum(1)
    assert torch.equal(n_emitted, acc + 1)
    non_bonus = result.emitted[:, :K]
    return non_bonus[non_bonus >= 0], acc


@pytest.mark.parametrize("with_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=7, top_p=0.95, min_p=0.02)],
    ids=["plain", "warped"],
)
def test_rejection_sampling_approximates_target_distribution(with_probs, sampling):
    torch.manual_seed(1234)
    target_logits = torch.randn(VOCAB) * 1.5
    target = warped_probs(target_logits, sampling)  # what plain sampling draws from
    if with_probs:
        # a warped draft distribution with zeros in it (as a real warped drafter has)
        draft_dist = warped_probs(torch.randn(VOCAB) * 1.5, SamplingParams(temperature=1.0, top_k=6))
    else:
        draft_dist = torch.softmax(torch.randn(VOCAB), -1)  # how the n-gram drafter happened to choose
    refs = torch.softmax(torch.randn(N_REF, VOCAB) * 1.5, -1)
    d_target, d_refs = [], []
    total_accepted = 0
    for i, n in enumerate(SIZES):
        tokens, acc = sample_outputs(n, target_logits, draft_dist, with_probs, sampling, seed=100 + i)
        total_accepted += int(acc.sum())
        hist = torch.bincount(tokens, minlength=VOCAB).float()
        hist /= hist.sum()
        d_target.append(float(torch.linalg.norm(hist - target)))
        d_refs.append(float(torch.linalg.norm(hist[None] - refs, dim=1).mean()))
        # never emits a token the warped target excludes
        assert float(target[tokens].min()) > 0
    target_ratio = d_target[0] / d_target[-1]
    ref_ratio = d_refs[0] / d_refs[-1]
    assert target_ratio > 20 * ref_ratio, (d_target, d_refs)
    assert d_target[-1] < 0.01, d_target
    assert total_accepted > 0


def test_distribution_test_detects_a_biased_verifier():
    """The criterion has power: emitting the draft tokens unverified fails it."""
    torch.manual_seed(7)
    target = torch.softmax(torch.randn(VOCAB) * 1.5, -1)
    draft_dist = torch.softmax(torch.randn(VOCAB) * 1.5, -1)
    refs = torch.softmax(torch.randn(N_REF, VOCAB) * 1.5, -1)
    d_t, d_r = [], []
    for n in SIZES:
        tokens = torch.multinomial(draft_dist, n, replacement=True)
        hist = torch.bincount(tokens, minlength=VOCAB).float() / n
        d_t.append(float(torch.linalg.norm(hist - target)))
        d_r.append(float(torch.linalg.norm(hist[None] - refs, dim=1).mean()))
    assert not (d_t[0] / d_t[-1] > 20 * d_r[0] / d_r[-1])


def test_greedy_verify_chain_prefix_rule():
    """Greedy: keep drafts while they equal the target argmax, then the argmax."""
    ctx = make_ctx(3, SamplingParams(), 0)
    logits = torch.full((3, K + 1, VOCAB), -5.0)
    target_ids = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    logits.scatter_(2, target_ids[:, :, None], 5.0)
    drafts = torch.tensor([[1, 2], [4, 0], [0, 8]])
    lengths = torch.tensor([2, 2, 1])
    r = verify_chain(ctx, DraftProposal(drafts, lengths), logits)
    assert r.accepted.tolist() == [2, 1, 0]
    assert r.emitted.tolist() == [[1, 2, 3], [4, 5, -1], [7, -1, -1]]


# --- end to end ------------------------------------------------------------------------

SAMPLING = dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.05)
N_ROWS = 1200
N_NEW = 4
SMALL_VOCAB = 64


def _samples(pipe, prompt, seeds, **sampling):
    out = pipe.generate([prompt] * len(seeds), max_new_tokens=N_NEW, seed=seeds, ignore_eos=True, **sampling)
    return [tuple(o.token_ids) for o in out], out


@pytest.fixture(scope="module")
def e2e():
    """A vocab-64 target (concentrated distributions), a draft that is a perturbed copy
    of it (q != p but overlapping), and a prompt holding every token once, so the n-gram
    drafter finds any sampled token in it and drafts what followed."""
    tok = ToyTokenizer(SMALL_VOCAB)
    target = build_model("llama", vocab_size=SMALL_VOCAB)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    prompt = (torch.randperm(SMALL_VOCAB - 3, generator=g) + 3).tolist()
    plain = MTPPipeline(target, tok, strategy="none")
    base, _ = _samples(plain, prompt, list(range(N_ROWS)), **SAMPLING)
    return tok, target, draft, prompt, plain, base


E2E_STRATEGIES = {
    "draft_model": "draft_model",
    "ngram": {"type": "ngram", "min_ngram": 1},  # the prompt is a permutation: only 1-grams repeat
    # n-gram draft (one-hot q) extended by the draft model (real q) in one proposal
    "cascade": {"type": "combination", "kind": "cascade", "components": [{"type": "ngram", "max_draft": 1, "min_ngram": 1}, "draft_model"]},
    "hybrid": "hybrid",
}


@pytest.mark.parametrize("strategy", list(E2E_STRATEGIES))
def test_speculative_sampling_matches_plain_sampling(e2e, strategy):
    tok, target, draft, prompt, plain, base = e2e
    spec = E2E_STRATEGIES[strategy]
    if isinstance(spec, dict):
        from lightspec_core.plugins import get_registry
        from lightspec_core.strategy_files import build_strategy

        spec = build_strategy(spec, get_registry())
    pipe = MTPPipeline(target, tok, strategy=spec, draft_model=None if strategy == "ngram" else draft,
                       budget={"type": "static", "k": 2})
    spec, out = _samples(pipe, prompt, list(range(10_000, 10_000 + N_ROWS)), **SAMPLING)
    drafted = sum(o.stats.drafted for o in out)
    accepted = sum(o.stats.accepted for o in out)
    assert drafted > N_ROWS and 0 < accepted < drafted, (drafted, accepted)
    # marginals of each position after the first (those went through verification), and pairs
    for pos in range(1, N_NEW):
        stat, df = two_sample_chi2([s[pos] for s in base], [s[pos] for s in spec])
        assert chi2_sf(stat, df) > 1e-3, f"position {pos}: chi2={stat:.1f} df={df}"
    for a, b in ((0, 1), (1, 2), (2, 3)):
        stat, df = two_sample_chi2([s[a:b + 1] for s in base], [s[a:b + 1] for s in spec])
        assert chi2_sf(stat, df) > 1e-3, f"pairs {a},{b}: chi2={stat:.1f} df={df}"


def test_e2e_distribution_test_has_power(e2e):
    """The same chi-square check rejects a somewhat different temperature."""
    tok, target, draft, prompt, plain, base = e2e
    other, _ = _samples(plain, prompt, list(range(20_000, 20_000 + N_ROWS)), **{**SAMPLING, "temperature": 1.3})
    stat, df = two_sample_chi2([s[1:3] for s in base], [s[1:3] for s in other])
    assert chi2_sf(stat, df) < 1e-3


REPRO_PROMPTS = [[5, 17, 33, 5, 17, 33, 5, 17], [9, 8, 7], [40, 41, 42, 43, 44, 45]]
REPRO_KW = dict(max_new_tokens=12, temperature=1.0, top_p=0.95, ignore_eos=True)


def _repro_pipe(strategy, budget="static"):
    target = cached_model("llama")
    return MTPPipeline(target, ToyTokenizer(), strategy=strategy,
                       draft_model=cached_model("llama", 1, 1) if strategy in ("draft_model", "hybrid") else None,
                       budget={"type": "static", "k": 3} if budget == "static" else budget)


@pytest.mark.parametrize("strategy", ["none", "draft_model", "ngram"])
def test_seeded_runs_are_reproducible(strategy):
    pipe = _repro_pipe(strategy)
    prompts, kw = REPRO_PROMPTS, REPRO_KW
    a = pipe.generate(prompts, seed=[1, 2, 3], **kw)
    b = pipe.generate(prompts, seed=[1, 2, 3], **kw)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.text for o in a] == [o.text for o in b]
    c = pipe.generate(prompts, seed=[4, 5, 6], **kw)
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    # one int seed for all rows is reproducible too
    d1 = pipe.generate(prompts, seed=11, **kw)
    d2 = pipe.generate(prompts, seed=11, **kw)
    assert [o.token_ids for o in d1] == [o.token_ids for o in d2]
    # string prompt + int seed
    s1 = pipe.generate("abcabcab", seed=3, **kw)
    s2 = pipe.generate("abcabcab", seed=3, **kw)
    assert s1.text == s2.text and s1.token_ids == s2.token_ids


@pytest.mark.parametrize(
    "strategy,budget", [("none", "static"), ("draft_model", "static"), ("ngram", "static"),
                        ("draft_model", "dynamic"), ("hybrid", "dynamic")]
)
def test_seeded_request_independent_of_batch(strategy, budget):
    """verify.py promises: "a seeded request is reproducible whatever else shares its batch".
    The dynamic budget keeps that promise by choosing each seeded row's draft length from
    that row's own record and timing-free costs."""
    pipe = _repro_pipe(strategy, budget)
    a = pipe.generate(REPRO_PROMPTS, seed=[1, 2, 3], **REPRO_KW)
    for i, s in enumerate([1, 2, 3]):
        alone = pipe.generate([REPRO_PROMPTS[i]], seed=[s], **REPRO_KW)[0]
        assert alone.token_ids == a[i].token_ids, f"row {i}"


# --- warping equals HF -------------------------------------------------------------------


def _hf_warp(logits, temperature, top_k, top_p, min_p):
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    x = logits.clone()
    ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
    if temperature not in (0, 1):
        x = TemperatureLogitsWarper(temperature)(ids, x)
    if top_k:
        x = TopKLogitsWarper(top_k=top_k)(ids, x)
    if top_p < 1.0:
        x = TopPLogitsWarper(top_p=top_p)(ids, x)
    if min_p > 0:
        x = MinPLogitsWarper(min_p=min_p)(ids, x)
    return x


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 1.0, 0.0),
        (1.3, 5, 1.0, 0.0),
        (1.0, 0, 0.8, 0.0),
        (1.0, 0, 1.0, 0.1),
        (0.6, 20, 0.9, 0.05),
        (2.0, 3, 0.5, 0.2),
        (1.0, 1, 1.0, 0.0),
        (1.0, 0, 0.01, 0.0),
    ],
)
@pytest.mark.parametrize("ties", [False, True])
def test_warp_logits_matches_hf(temperature, top_k, top_p, min_p, ties):
    torch.manual_seed(0)
    logits = torch.randn(16, 300) * 3
    if ties:
        logits = logits.round()  # many exact ties at the top-k / top-p boundaries
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ours = warp_logits(logits, params)
    ref = _hf_warp(logits, temperature, top_k, top_p, min_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(ours[finite], ref[finite], rtol=0, atol=0)
    torch.testing.assert_close(warped_probs(logits, params), ref.softmax(-1))
    assert bool(finite.any(-1).all())


def test_sampling_params_validation():
    for bad in (dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=1.0),
                dict(temperature=float("nan"))):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(TypeError):  # a value of the wrong type: InvalidTypeError
        SamplingParams(seed="x")
    assert SamplingParams().greedy and not SamplingParams(temperature=0.5).greedy


def test_exponential_noise_is_exp1_per_row_and_samples_p():
    """``exponential_noise``: Exp(1) values (mean, variance and quantiles), each row from its
    own generator (same seed, same row, whatever the other rows), and argmax(p / noise)
    draws from p (the exponential race)."""
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    e = exponential_noise(gens, 200_000, torch.device("cpu"))
    assert e.shape == (2, 200_000) and bool((e >= 0).all()) and not bool(e.isnan().any())
    for row in e:
        assert abs(float(row.mean()) - 1.0) < 0.01 and abs(float(row.var()) - 1.0) < 0.03
        qs = torch.quantile(row[:100_000], torch.tensor([0.25, 0.5, 0.9]))
        assert torch.allclose(qs, -torch.log1p(-torch.tensor([0.25, 0.5, 0.9])), atol=0.02)
    again = exponential_noise([torch.Generator().manual_seed(2)], 200_000, torch.device("cpu"))
    assert torch.equal(again[0], e[1])
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    n = 60_000
    g = torch.Generator().manual_seed(3)
    picks = (p / exponential_noise([g] * n, 4, torch.device("cpu"))).argmax(-1)
    freq = torch.bincount(picks, minlength=4).float() / n
    assert torch.allclose(freq, p, atol=0.01) and int(freq[3] * n) == 0


def test_inverse_cdf_sampling_draws_from_p():
    """``sample_inverse_cdf``: one uniform per row gives a draw from p (frequencies within
    0.01 over 60,000 rows, unnormalised p too), never a token of probability 0 (first,
    last and inner ones, and u = 0), each row from its own generator."""
    p = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    n = 60_000
    g = torch.Generator().manual_seed(4)
    u = row_uniforms([g] * n, torch.device("cpu"))
    assert u.shape == (n,) and u.dtype == torch.float64 and bool(((u >= 0) & (u < 1)).all())
    for scale in (1.0, 3.7):
        picks = sample_inverse_cdf((p * scale).expand(n, 6), u)
        freq = torch.bincount(picks, minlength=6).double() / n
        assert torch.allclose(freq, p.double(), atol=0.01), freq
        assert int(torch.bincount(picks, minlength=6)[[0, 2, 5]].sum()) == 0
    edge = sample_inverse_cdf(p.expand(2, 6), torch.tensor([0.0, 1 - 1e-12], dtype=torch.float64))
    assert edge.tolist() == [1, 4]
    a = row_uniforms([torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)], torch.device("cpu"))
    b = row_uniforms([torch.Generator().manual_seed(2)], torch.device("cpu"))
    assert a[1] == b[0]


def test_a_row_without_a_draft_samples_what_a_plain_step_samples():
    """In a sampled verify, a row whose draft is empty emits exactly ``sample_next``'s token
    from the same generator state (so a seeded row's output does not depend on whether
    other rows of its batch drafted), while drafting rows go through rejection sampling."""
    from lightspec_core.verify import sample_next

    sampling = SamplingParams(temperature=0.8)
    logits = torch.randn(4, K + 1, VOCAB, generator=torch.Generator().manual_seed(5)) * 2
    lengths = torch.tensor([0, 2, 0, K])
    proposal = DraftProposal(tokens=torch.randint(0, VOCAB, (4, K), generator=torch.Generator().manual_seed(6)),
                             lengths=lengths, source="test")
    for seed in range(20):
        ctx = make_ctx(4, sampling, seed)
        ctx.generators = [torch.Generator().manual_seed(seed * 10 + b) for b in range(4)]
        result = verify_chain(ctx, proposal, logits)
        plain = sample_next(logits[:, 0], sampling, [torch.Generator().manual_seed(seed * 10 + b) for b in range(4)])
        assert result.emitted[0, 0] == plain[0] and result.emitted[2, 0] == plain[2]
        assert result.accepted[0] == 0 and result.accepted[2] == 0
        assert result.emitted[0, 1:].eq(-1).all() and result.emitted[2, 1:].eq(-1).all()
