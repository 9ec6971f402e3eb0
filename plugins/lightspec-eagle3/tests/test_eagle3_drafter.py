"""The ``eagle3`` strategy: lossless greedy (token-identical to HF at batch 1 and 8, fp32),
its cache rolled back to exactly the committed pairs, the training-time test unrolling what
drafting computes, the tree-expansion protocol agreeing with the chain, cascades from YAML,
and sampling that keeps the target's distribution (chi-square against plain sampling)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from e3_fixtures import random_head, tiny_target, write_layout
from lightspec_eagle3.checkpoint import load_head
from lightspec_eagle3.drafter import Eagle3Drafter
from lightspec_eagle3.modeling import ttt_logits
from lightspec_eagle3.train import TrainArgs, train
from models import ToyTokenizer

from lightspec_core import MTPPipeline

PROMPTS = [[5, 17, 33, 5, 17, 33, 5, 17], [9, 8, 7], [40, 41, 42, 43, 44, 45], [3, 4], [60, 61, 62, 60, 61],
           [70] * 6, [11, 12, 13, 14, 15, 16, 17, 18, 19], [90, 80, 70]]


def hf_greedy(model, ids, n):
    x = torch.tensor([ids])
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny target and a head trained on its own samples (so drafts are often accepted)."""
    target = tiny_target()
    tmp = tmp_path_factory.mktemp("e3")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        seqs = torch.randint(3, 96, (64, 1), generator=g)
        for _ in range(47):
            p = torch.softmax(target(input_ids=seqs).logits[:, -1] / 0.7, -1)
            seqs = torch.cat([seqs, torch.multinomial(p, 1, generator=g)], 1)
    np.save(tmp / "data.npy", seqs.flatten().numpy())
    target.save_pretrained(tmp / "target")
    _save_tokenizer(tmp / "target")
    args = TrainArgs(target=str(tmp / "target"), data=[str(tmp / "data.npy")], out=str(tmp / "head"), draft_vocab=64,
                     intermediate_size=64, heads=4, kv_heads=2, seq_len=32, batch=16, ttt_steps=3, lr=3e-3,
                     max_steps=150, checkpoint_every_s=1e9)
    train(args, progress=False)
    return target, tmp / "head"


def _save_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>"] + [f"w{i}" for i in range(3, 96)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                            bos_token="<bos>").save_pretrained(folder)


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_identical_to_hf(trained, batch):
    target, head_dir = trained
    drafter = Eagle3Drafter(head=str(head_dir), max_draft=4)
    pipe = MTPPipeline(target, ToyTokenizer(96), strategy=drafter, budget={"type": "static", "k": 4})
    prompts = PROMPTS[:batch]
    outs = pipe.generate(prompts, max_new_tokens=24, ignore_eos=True)
    outs = outs if isinstance(outs, list) else [outs]
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(target, p, 24)
    accepted = sum(o.stats.accepted for o in outs)
    drafted = sum(o.stats.drafted for o in outs)
    assert 0 < accepted < drafted, (accepted, drafted)  # partial acceptance: rollbacks happened
    # the head's cache holds exactly the committed pairs: its last output equals a fresh forward's
    b = len(prompts) - 1
    seq = list(prompts[b]) + outs[b].token_ids
    fed = drafter.fed[drafter.rows.index(b)] if b in drafter.rows else None
    if fed is not None:
        ids = torch.tensor([seq[: fed + 1]])
        with torch.no_grad():
            hs = target(input_ids=ids, output_hidden_states=True).hidden_states
            taps = torch.cat([hs[i] for i in drafter.hidden_layers], -1)[:, :fed]
            h = ttt_logits_free_forward(drafter.head, taps, ids[:, 1:])
        torch.testing.assert_close(drafter.last_h[drafter.rows.index(b)], h[0, -1], atol=1e-4, rtol=1e-4)


def ttt_logits_free_forward(head, taps, ids):
    """The head over committed pairs from scratch (one causal forward, no cache reuse)."""
    from lightspec_eagle3.drafter import _CacheModel

    from lightspec_core import KVCache

    runner = _CacheModel(head)
    kv = KVCache(runner, ids.shape[0], torch.device("cpu"), capacity=ids.shape[1] + 4)
    runner.features = head.fuse(taps)
    return kv.forward(ids).hidden


def test_training_time_test_unrolls_what_drafting_computes(tmp_path):
    """ttt_logits step s at index t == the chain's s-th draft distribution after pairs 0..t,
    with the true tokens fed as drafts."""
    target = tiny_target()
    head = load_head(write_layout(tmp_path / "h", random_head(target), "eagle"), target)
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i] for i in head.cfg.taps(6)], -1)
        unrolled = ttt_logits(head, head.fuse(taps), ids, 3)
        from lightspec_eagle3.drafter import _CacheModel

        from lightspec_core import KVCache

        for t in (0, 4, 7):
            runner = _CacheModel(head)
            kv = KVCache(runner, 1, torch.device("cpu"), capacity=32)
            runner.features = head.fuse(taps[:, : t + 1])
            h = kv.forward(ids[:, 1: t + 2]).hidden[:, -1]
            for s in range(1, 4):
                torch.testing.assert_close(head.draft_logits(h)[0], unrolled[s - 1][0, t], atol=1e-4, rtol=1e-4)
                runner.features = head.feedback(h)[:, None]
                h = kv.forward(ids[:, t + s + 1: t + s + 2]).hidden[:, -1]


class _Ctx:
    """What catch_up and the chain read from a StepContext."""

    def __init__(self, target, seqs, layers):
        from lightspec_core import SamplingParams, StepTimer

        self.sequences = [tuple(s) for s in seqs]
        self.row_ids = list(range(len(seqs)))
        self.batch = len(seqs)
        self.device = torch.device("cpu")
        self.step = 1
        self.prefix = None
        self.sampling = SamplingParams()
        self.timer = StepTimer()
        n = max(len(s) for s in seqs) - 1
        ids = torch.tensor([list(s[:-1]) + [0] * (n - len(s) + 1) for s in seqs])
        with torch.no_grad():
            hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        self.hidden_states = {i: hs[i] for i in layers}
        self.hidden_positions = torch.zeros(len(seqs), dtype=torch.long)
        self.hidden_lengths = torch.tensor([len(s) - 1 for s in seqs])
        self.max_draft_list = [5] * len(seqs)
        self.min_confidence = torch.zeros(len(seqs))


def _drafter(trained):
    target, head_dir = trained
    d = Eagle3Drafter(head=load_head(head_dir, target), max_draft=5)
    d._bind(target)
    return target, d


def test_tree_protocol_greedy_path_equals_chain(trained):
    target, d = _drafter(trained)
    seqs = [PROMPTS[0], PROMPTS[6]]
    ctx = _Ctx(target, seqs, d.hidden_layers)
    chain = d.lightspec_propose(ctx=ctx).tokens
    d.reset()
    lp = d.tree_start(_Ctx(target, seqs, d.hidden_layers))
    assert lp.shape == (2, 96) and lp.dtype == torch.float32
    assert torch.isinf(lp).sum(-1).tolist() == [96 - 64] * 2  # -inf outside the draft vocabulary
    toks, n = [], 0
    for j in range(5):
        tok = lp.argmax(-1)
        toks.append(tok)
        parents = torch.full((2, 1), -1 if j == 0 else n - 1)
        lp = d.tree_step(tok[:, None], parents)[:, 0]
        n += 1
    d.tree_commit(None)
    assert torch.equal(torch.stack(toks, 1), chain)
    assert d.kv.lengths == [len(s) - 1 for s in seqs]  # the tree left the cache


def test_tree_branches_are_independent(trained):
    """A node's distribution depends on its ancestors only: a second branch, expanded in the
    same tree, gives what a tree holding that branch alone gives."""
    target, d = _drafter(trained)
    seq = [PROMPTS[2]]
    d.tree_start(_Ctx(target, seq, d.hidden_layers))
    a = d.tree_step(torch.tensor([[10, 20]]), torch.tensor([[-1, -1]]))
    b = d.tree_step(torch.tensor([[30, 40, 50]]), torch.tensor([[0, 1, 1]]))
    c = d.tree_step(torch.tensor([[60]]), torch.tensor([[3]]))  # under node 3 (40, under 20)
    d.tree_commit(None)
    d.reset()
    d.tree_start(_Ctx(target, seq, d.hidden_layers))
    a2 = d.tree_step(torch.tensor([[20]]), torch.tensor([[-1]]))
    b2 = d.tree_step(torch.tensor([[40]]), torch.tensor([[0]]))
    c2 = d.tree_step(torch.tensor([[60]]), torch.tensor([[1]]))
    fin = torch.isfinite(a2[:, 0])
    for x, y in ((a[:, 1], a2[:, 0]), (b[:, 1], b2[:, 0]), (c[:, 0], c2[:, 0])):
        torch.testing.assert_close(x[fin], y[fin], atol=1e-4, rtol=1e-4)
    with pytest.raises(Exception, match="parents"):
        d.tree_step(torch.tensor([[1]]), torch.tensor([[7]]))


def test_cascade_ngram_into_eagle3_from_yaml(trained, tmp_path):
    from lightspec_core.plugins import get_registry
    from lightspec_core.strategy_files import build_strategy

    target, head_dir = trained
    spec = {"type": "combination", "kind": "cascade",
            "components": [{"type": "ngram", "max_draft": 3}, {"type": "eagle3", "head": str(head_dir), "max_draft": 4}]}
    strategy = build_strategy(spec, get_registry())
    pipe = MTPPipeline(target, ToyTokenizer(96), strategy=strategy, budget={"type": "static", "k": 6})
    outs = pipe.generate(PROMPTS[:4], max_new_tokens=20, ignore_eos=True)
    for p, o in zip(PROMPTS[:4], outs):
        assert o.token_ids == hf_greedy(target, p, 20)
    assert sum(o.stats.accepted for o in outs) > 0


def _chi2(a, b):
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    bins, ra, rb = [], 0, 0
    for c in set(ca) | set(cb):
        if ca[c] + cb[c] >= 10:
            bins.append((ca[c], cb[c]))
        else:
            ra, rb = ra + ca[c], rb + cb[c]
    if ra + rb:
        bins.append((ra, rb))
    na, nb = len(a), len(b)
    stat = sum((x - (x + y) * na / (na + nb)) ** 2 / ((x + y) * na / (na + nb))
               + (y - (x + y) * nb / (na + nb)) ** 2 / ((x + y) * nb / (na + nb)) for x, y in bins)
    df = len(bins) - 1
    import math

    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampling_keeps_the_target_distribution(trained):
    target, head_dir = trained
    kw = dict(max_new_tokens=4, ignore_eos=True, temperature=0.9, top_k=20, top_p=0.95)
    n = 600
    plain = MTPPipeline(target, ToyTokenizer(96), strategy="none")
    base = [tuple(o.token_ids) for o in plain.generate([PROMPTS[0]] * n, seed=list(range(n)), **kw)]
    spec = MTPPipeline(target, ToyTokenizer(96), strategy=Eagle3Drafter(head=str(head_dir), max_draft=3),
                       budget={"type": "static", "k": 3})
    outs = spec.generate([PROMPTS[0]] * n, seed=list(range(10_000, 10_000 + n)), **kw)
    got = [tuple(o.token_ids) for o in outs]
    drafted, accepted = sum(o.stats.drafted for o in outs), sum(o.stats.accepted for o in outs)
    assert drafted > n and 0 < accepted < drafted
    for pos in range(1, 4):
        assert _chi2([s[pos] for s in base], [s[pos] for s in got]) > 1e-3, pos
    assert _chi2([s[1:3] for s in base], [s[1:3] for s in got]) > 1e-3
    # the same check tells a different temperature apart
    other = [tuple(o.token_ids) for o in plain.generate([PROMPTS[0]] * n, seed=list(range(20_000, 20_000 + n)),
                                                         **{**kw, "temperature": 1.6})]
    assert _chi2([s[1:3] for s in base], [s[1:3] for s in other]) < 1e-3


@pytest.mark.parametrize("max_pending", [64, 2])
def test_a_zero_budget_keeps_the_states_and_the_next_draft_catches_up(trained, monkeypatch, max_pending):
    """A composition hands a skipped head its new hidden states with a zero budget: the head
    keeps them without a forward (at most ``MAX_PENDING`` steps unfused), and its next draft
    (fed every pair since at once) equals the draft of a head that was fed them step by step."""
    import lightspec_eagle3.drafter as drafter_module

    monkeypatch.setattr(drafter_module, "MAX_PENDING", max_pending)
    target, lazy = _drafter(trained)
    _, eager = _drafter(trained)
    seq = list(PROMPTS[6]) + [20, 21, 22, 23, 24]
    first = _Ctx(target, [seq[:9]], lazy.hidden_layers)
    lazy.lightspec_propose(ctx=first)
    eager.lightspec_propose(ctx=_Ctx(target, [seq[:9]], eager.hidden_layers))
    fed = list(lazy.fed)
    for end in range(10, len(seq)):  # one committed token per step, each handed over once
        for d in (lazy, eager):
            ctx = _Ctx(target, [seq[:end]], d.hidden_layers)
            ctx.hidden_states = {i: h[:, end - 2: end - 1] for i, h in ctx.hidden_states.items()}
            ctx.hidden_positions, ctx.hidden_lengths = torch.tensor([end - 2]), torch.tensor([1])
            if d is lazy:
                ctx.max_draft_list = [0]
                assert d.lightspec_propose(ctx=ctx) is None
            else:
                d.catch_up(ctx)
    assert lazy.fed == fed and eager.fed != fed  # the skipped head ran no forward
    assert len(lazy.pending) == (len(seq) - 10) % max_pending  # nor its fc: the taps wait, unfused
    last = _Ctx(target, [seq], lazy.hidden_layers)
    last.hidden_states = {i: h[:, len(seq) - 2:] for i, h in last.hidden_states.items()}
    last.hidden_positions, last.hidden_lengths = torch.tensor([len(seq) - 2]), torch.tensor([1])
    got = lazy.lightspec_propose(ctx=last)
    want = eager.lightspec_propose(ctx=last)
    assert lazy.pending == [] and lazy.have == eager.have
    assert torch.equal(got.tokens, want.tokens) and got.lengths.tolist() == want.lengths.tolist()
    torch.testing.assert_close(got.confidence, want.confidence, atol=1e-4, rtol=1e-4)


def test_a_gap_in_the_hidden_states_restarts_the_row(trained):
    """The engine keeps at most ~1k pending states per row; when earlier ones are gone the
    row's cache starts again from the first state it has (relative positions: RoPE does
    not care), instead of failing every step."""
    target, d = _drafter(trained)
    seq = list(PROMPTS[6]) + [20, 21, 22, 23, 24]
    ctx = _Ctx(target, [seq[:9]], d.hidden_layers)
    d.catch_up(ctx)
    later = _Ctx(target, [seq], d.hidden_layers)  # states of positions 0..12; hand over only 11..12
    later.hidden_states = {i: h[:, 11:13] for i, h in later.hidden_states.items()}
    later.hidden_positions, later.hidden_lengths = torch.tensor([11]), torch.tensor([2])
    got = d.catch_up(later).clone()
    assert d.kv.lengths == [2]
    _, fresh = _drafter(trained)
    torch.testing.assert_close(fresh.catch_up(later), got)


def test_a_tree_that_starts_as_a_chain_branches_as_any_tree(trained):
    """Nodes added one per call, each under the one before, take the chain's cheaper path;
    a level that then branches sees exactly the ancestors a tree built with a mask from the
    start gives it (here: the same nodes after a sibling that shares no ancestry)."""
    target, d = _drafter(trained)
    seq = [PROMPTS[4]]
    d.tree_start(_Ctx(target, seq, d.hidden_layers))
    d.tree_step(torch.tensor([[20]]), torch.tensor([[-1]]))
    d.tree_step(torch.tensor([[40]]), torch.tensor([[0]]))
    fork = d.tree_step(torch.tensor([[60, 70]]), torch.tensor([[1, 1]]))
    after = d.tree_step(torch.tensor([[80]]), torch.tensor([[3]]))  # under 70
    d.tree_commit(None)
    d.reset()
    d.tree_start(_Ctx(target, seq, d.hidden_layers))
    d.tree_step(torch.tensor([[10, 20]]), torch.tensor([[-1, -1]]))  # 10 is no ancestor of what follows
    d.tree_step(torch.tensor([[40]]), torch.tensor([[1]]))
    fork2 = d.tree_step(torch.tensor([[60, 70]]), torch.tensor([[2, 2]]))
    after2 = d.tree_step(torch.tensor([[80]]), torch.tensor([[4]]))
    fin = torch.isfinite(fork2[0, 0])
    for x, y in ((fork, fork2), (after, after2)):
        torch.testing.assert_close(x[..., fin], y[..., fin], atol=1e-4, rtol=1e-4)
