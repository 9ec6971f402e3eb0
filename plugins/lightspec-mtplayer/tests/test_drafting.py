"""The ``mtp`` strategy drafts what its heads say and never changes the output.

* greedy output is token-identical to HF greedy at batch 1 and 8 (fp32), for MTP modules
  read from the target's own checkpoint (Llama and Qwen2; one module, and two modules reused
  past their number) and for Medusa heads, also when rows finish at different steps;
* each proposal equals a from-scratch reference of the documented drafting rule (MTP: the
  modules re-run over the whole pair sequence, no cache; Medusa: the heads at the last state);
* Medusa's per-head distributions and the tree expansion protocol (``tree_start`` /
  ``tree_step``: depth-d nodes get head d's distribution); MTP modules refuse tree expansion;
* sampled output has plain sampling's distribution (two-sample chi-square per position).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from fixtures import VOCAB, hf_greedy, medusa_tensors, save_medusa_legacy, save_target_with_mtp, tiny_tokenizer
from lightspec_mtplayer.strategy import MTPStrategy
from stat_tests import two_sample_p
from transformers import AutoModelForCausalLM

from lightspec_core import DraftProposal, LightSpecError, MTPPipeline, hookimpl

PROMPTS = [[5, 9, 13, 5, 9], [7, 8], [20, 21, 22, 23, 24, 25, 26], [40], [11, 12, 11, 12, 11, 12], [60, 3, 61],
           [30, 31, 30, 31, 30, 31, 30], [50, 52, 54, 56]]


def _load(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def mtp_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp_llama")
    save_target_with_mtp(folder, "llama", n=1, own_head=True)
    return folder


@pytest.fixture(scope="module")
def mtp_qwen2_two(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp_qwen2")
    save_target_with_mtp(folder, "qwen2", n=2, own_head=False, sharded=True)
    return folder


@pytest.fixture(scope="module")
def medusa_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("medusa_target")
    save_target_with_mtp(folder, "llama", n=1)  # the target; its MTP modules are not used here
    blocks, lm = medusa_tensors(32, VOCAB, heads=3, layers=1)
    heads = save_medusa_legacy(tmp_path_factory.mktemp("medusa"), blocks, lm, 32, VOCAB)
    return folder, heads


class Recording(MTPStrategy):
    """The strategy, keeping every (sequences, proposal) it made."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = []

    @hookimpl
    def lightspec_propose(self, ctx):
        proposal = self.impl.propose(ctx, self.layer)
        if proposal is not None:
            pre = [[] for _ in ctx.sequences] if ctx.prefix is None else [
                ctx.prefix[b, : int(ctx.prefix_lengths[b])].tolist() for b in range(ctx.batch)]
            self.seen.append(([list(s) for s in ctx.sequences], proposal.node_rows(), pre))
        return proposal


def _check_greedy(target, strategy, batch, n=12, eos=None):
    tok = tiny_tokenizer()
    pipe = MTPPipeline(target, tok, strategy=strategy, budget={"type": "static", "k": 4})
    prompts = PROMPTS[:batch]
    kw = {"ignore_eos": True} if eos is None else {"eos_token_id": eos}
    outs = pipe.generate(prompts, max_new_tokens=n, **kw)
    drafted = 0
    for p, o in zip(prompts, outs):
        ref = hf_greedy(target, p, n)
        if eos is not None and eos in ref:
            ref = ref[: ref.index(eos) + 1]
        assert o.token_ids == ref
        drafted += o.stats.drafted
    assert drafted > 0
    return outs


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("which", ["mtp_llama", "mtp_qwen2_two"])
def test_mtp_greedy_identical_to_hf(request, which, batch):
    folder = request.getfixturevalue(which)
    target = _load(folder)
    strategy = Recording(max_draft=4)
    _check_greedy(target, strategy, batch)
    assert strategy.kind == "mtp" and strategy.hidden_layers == [2]
    _check_mtp_reference(target, strategy)


def _check_mtp_reference(target, strategy):
    """Every recorded draft equals the drafting rule recomputed from scratch (module docstring)."""
    layers = strategy.impl.layers
    n = len(layers)
    L = target.config.num_hidden_layers
    checked = 0
    for seqs, drafts, prefixes in strategy.seen[:6]:
        for seq, draft, pre in zip(seqs, drafts, prefixes):
            if not draft:
                continue
            with torch.no_grad():
                h = target(input_ids=torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[L][0]
                toks, states, ref = list(seq[1:]), [s for s in h], []
                for j in range(len(pre) + len(draft)):
                    q = len(toks)
                    mask = torch.ones(q, q, dtype=torch.bool).tril()[None, None]
                    pos = torch.arange(q)[None]
                    outs = [m(torch.tensor([toks]), torch.stack(states)[None], pos, mask) for m in layers]
                    o = outs[j % n][0, -1]
                    d = int(layers[j % n].head(o).argmax())
                    if j < len(pre):  # a cascade's prefix token goes through the chain
                        d = pre[j]
                    else:
                        ref.append(d)
                    toks.append(d)
                    states.append(o)
            assert draft == ref, (seq, draft, ref)
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("batch", [1, 8])
def test_medusa_greedy_identical_to_hf(medusa_llama, batch):
    folder, heads = medusa_llama
    target = _load(folder)
    strategy = Recording(head=str(heads), max_draft=5)
    _check_greedy(target, strategy, batch)
    assert strategy.kind == "medusa"
    medusa = strategy.impl.heads
    for seqs, drafts, _ in strategy.seen[:5]:
        with torch.no_grad():
            for seq, draft in zip(seqs, drafts):
                h = target(input_ids=torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[2][0, -1]
                ref = medusa(h).argmax(-1).tolist()
                assert len(draft) <= 3 and draft == ref[: len(draft)]


def test_rows_finishing_at_different_steps(mtp_llama, medusa_llama):
    target = _load(mtp_llama)
    refs = [hf_greedy(target, p, 12) for p in PROMPTS]
    eos = Counter(t for r in refs for t in r[2:10]).most_common(1)[0][0]  # a token some rows emit mid-way
    outs = _check_greedy(target, MTPStrategy(), 8, eos=eos)
    assert len({len(o.token_ids) for o in outs}) > 1
    folder, heads = medusa_llama
    _check_greedy(_load(folder), MTPStrategy(head=str(heads)), 8, eos=eos)


def test_medusa_tree_expansion(medusa_llama):
    folder, heads = medusa_llama
    target = _load(folder)
    results = []

    class TreeProbe(MTPStrategy):
        @hookimpl
        def lightspec_propose(self, ctx):
            if not results:
                all_heads = self.head_logprobs(ctx)  # [B, 3, V]
                root = self.tree_start(ctx)
                tokens = torch.tensor([[4, 5]] * ctx.batch)
                d1 = self.tree_step(tokens, torch.full_like(tokens, -1))
                d2 = self.tree_step(tokens[:, :1], torch.zeros_like(tokens[:, :1]))
                with pytest.raises(LightSpecError, match="needs Medusa head 3, but there are only 3 heads"):
                    self.tree_step(tokens[:, :1], torch.zeros_like(tokens[:, :1]))
                top_lp, top_ids = self.head_topk(ctx, 4)
                results.append((all_heads, root, d1, d2, top_lp, top_ids))
            return super().lightspec_propose(ctx)

    probe = TreeProbe(head=str(heads))
    assert not probe.supports_tree_expansion  # not loaded yet
    MTPPipeline(target, tiny_tokenizer(), strategy=probe, budget={"type": "static", "k": 3}).generate(
        PROMPTS[:2], max_new_tokens=4, ignore_eos=True)
    assert probe.supports_tree_expansion
    all_heads, root, d1, d2, top_lp, top_ids = results[0]
    assert all_heads.shape == (2, 3, VOCAB)
    torch.testing.assert_close(all_heads.exp().sum(-1), torch.ones(2, 3))
    torch.testing.assert_close(root, all_heads[:, 0])
    assert d1.shape == (2, 2, VOCAB) and d2.shape == (2, 1, VOCAB)
    torch.testing.assert_close(d1, all_heads[:, 1, None].expand(2, 2, VOCAB))
    torch.testing.assert_close(d2[:, 0], all_heads[:, 2])
    assert top_ids.shape == (2, 3, 4)
    assert torch.equal(top_ids[..., 0], all_heads.argmax(-1))
    torch.testing.assert_close(top_lp, all_heads.gather(-1, top_ids))


def test_mtp_modules_refuse_tree_expansion(mtp_llama):
    target = _load(mtp_llama)
    strategy = MTPStrategy()
    MTPPipeline(target, tiny_tokenizer(), strategy=strategy).generate([PROMPTS[0]], max_new_tokens=2, ignore_eos=True)
    assert strategy.kind == "mtp" and not strategy.supports_tree_expansion
    with pytest.raises(LightSpecError, match="tree expansion need Medusa heads"):
        strategy.tree_start(None)


def test_auto_head_without_mtp_modules_is_an_error(medusa_llama, tmp_path):
    from fixtures import build_target

    target = build_target("llama")
    target.save_pretrained(tmp_path)
    with pytest.raises(LightSpecError, match="found no head for this target"):
        MTPPipeline(_load(tmp_path), tiny_tokenizer(), strategy="mtp")
    with pytest.raises(LightSpecError, match="max_draft=0 is invalid"):
        MTPStrategy(max_draft=0)


# -- sampling keeps the distribution ----------------------------------------------------------

SAMPLING = dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.05)
N_ROWS, N_NEW = 1200, 4


@pytest.mark.parametrize("kind", ["mtp", "medusa"])
def test_sampling_matches_plain_sampling(mtp_llama, medusa_llama, kind):
    folder, heads = (mtp_llama, None) if kind == "mtp" else medusa_llama
    target = _load(folder)
    tok = tiny_tokenizer()
    prompt = [5, 9, 13, 5, 9, 13, 5]
    plain = MTPPipeline(target, tok, strategy="none")
    base = [tuple(o.token_ids) for o in plain.generate([prompt] * N_ROWS, max_new_tokens=N_NEW, seed=list(range(N_ROWS)),
                                                       ignore_eos=True, **SAMPLING)]
    strategy = MTPStrategy(**({"head": str(heads)} if heads else {}))
    pipe = MTPPipeline(target, tok, strategy=strategy, budget={"type": "static", "k": 3})
    outs = pipe.generate([prompt] * N_ROWS, max_new_tokens=N_NEW, seed=list(range(10_000, 10_000 + N_ROWS)),
                         ignore_eos=True, **SAMPLING)
    spec = [tuple(o.token_ids) for o in outs]
    drafted = sum(o.stats.drafted for o in outs)
    accepted = sum(o.stats.accepted for o in outs)
    assert drafted > N_ROWS and 0 < accepted < drafted, (drafted, accepted)
    for pos in range(1, N_NEW):
        assert two_sample_p([s[pos] for s in base], [s[pos] for s in spec]) > 1e-3, pos
    for a in range(N_NEW - 1):
        assert two_sample_p([s[a : a + 2] for s in base], [s[a : a + 2] for s in spec]) > 1e-3, a
    # the test has power: another temperature is told apart
    hot = [tuple(o.token_ids) for o in plain.generate([prompt] * N_ROWS, max_new_tokens=N_NEW,
                                                      seed=list(range(20_000, 20_000 + N_ROWS)), ignore_eos=True,
                                                      **{**SAMPLING, "temperature": 1.6})]
    assert two_sample_p([s[1:3] for s in base], [s[1:3] for s in hot]) < 1e-3


class _OneToken:
    """Drafts one token per row: the target's greedy next token on even steps, a wrong one on odd."""

    name = "one_token"

    def __init__(self, target):
        self.target = target

    @hookimpl
    def lightspec_propose(self, ctx):
        toks = []
        with torch.no_grad():
            for seq in ctx.sequences:
                t = int(self.target(input_ids=torch.tensor([list(seq)])).logits[0, -1].argmax())
                toks.append(t if ctx.step % 2 == 0 else (t + 1) % VOCAB)
        return DraftProposal(tokens=torch.tensor(toks)[:, None], lengths=torch.ones(ctx.batch, dtype=torch.long),
                             source=self.name)


@pytest.mark.parametrize("which", ["mtp_llama", "medusa"])
def test_cascade_continues_after_the_prefix(request, which, medusa_llama, mtp_llama):
    """In a cascade the heads continue an earlier drafter's tokens: MTP modules run their chain
    through the prefix tokens, Medusa rows start at head m for an m-token prefix."""
    from lightspec_core.composer import Combination

    folder, heads = (mtp_llama, None) if which == "mtp_llama" else medusa_llama
    target = _load(folder)
    rec = Recording(max_draft=4, **({"head": str(heads)} if heads else {}))
    combo = Combination("casc", "cascade", [_OneToken(target), rec], fusion=_concat())
    pipe = MTPPipeline(target, tiny_tokenizer(), strategy=combo, budget={"type": "static", "k": 4})
    outs = pipe.generate(PROMPTS[:3], max_new_tokens=12, ignore_eos=True)
    for p, o in zip(PROMPTS[:3], outs):
        assert o.token_ids == hf_greedy(target, p, 12)
    assert rec.seen and combo.hidden_layers == [2]
    assert all(len(pre) == 1 for _, _, prefixes in rec.seen for pre in prefixes)
    if heads is None:
        _check_mtp_reference(target, rec)
        return
    for seqs, drafts, _ in rec.seen[:4]:
        for seq, draft in zip(seqs, drafts):
            with torch.no_grad():
                h = target(input_ids=torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[2][0, -1]
                ref = rec.impl.heads(h).argmax(-1).tolist()
            assert draft and draft == ref[1 : 1 + len(draft)]  # after a one-token prefix: heads 1, 2, ...


def _concat():
    from lightspec_core.plugins import get_registry

    return get_registry().create("fusion", "concat")


def test_trees_over_medusa_heads_keep_to_their_depth(medusa_llama, mtp_llama):
    """lightspec-tree's trees over ``mtp``: a default tree is cut to one level per Medusa
    head (3 here) at start-up and drafts without failures; a deeper tree the user asks for,
    and trees over MTP modules, are refused at start-up with what is allowed."""
    pytest.importorskip("lightspec_tree")
    folder, heads = medusa_llama
    target, tok = _load(folder), tiny_tokenizer()
    over = {"drafter": "mtp", "drafter_options": {"head": str(heads)}, "adaptive": False}
    expected = MTPPipeline(target, tok, strategy="none").generate(PROMPTS, max_new_tokens=10, ignore_eos=True)
    for kind, fitted in (("dynamic_tree", lambda s: s.depth == 3),
                         ("static_tree", lambda s: max(len(p) for p in s.choices) == 3)):
        pipe = MTPPipeline(target, tok, strategy={"type": kind, **over}, budget={"type": "static", "k": 6})
        assert fitted(pipe.strategy), kind
        out = pipe.generate(PROMPTS, max_new_tokens=10, ignore_eos=True)
        assert [o.token_ids for o in out] == [o.token_ids for o in expected]
        assert not any(o.stats.failures for o in out) and sum(o.stats.drafted for o in out) > 0
    with pytest.raises(LightSpecError, match=r"depth=5 is invalid with drafter 'mtp', which grows trees at most 3 "
                                             r"levels deep; use depth <= 3"):
        MTPPipeline(target, tok, strategy={"type": "dynamic_tree", "depth": 5, **over})
    with pytest.raises(LightSpecError, match=r"choices reach depth 4, but drafter 'mtp' grows trees at most 3 levels"):
        MTPPipeline(target, tok, strategy={"type": "static_tree", "choices": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]],
                                           **over})
    with pytest.raises(LightSpecError, match=r"drafter 'mtp' cannot grow token trees with the head it loaded"):
        MTPPipeline(_load(mtp_llama), tok, strategy={"type": "dynamic_tree", "drafter": "mtp"})
