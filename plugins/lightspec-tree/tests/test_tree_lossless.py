"""Tree strategies are lossless: greedy output token-identical to HF's at batch 1 and 8 on
several architectures, through real tree masks; the drafter's own cache keeps the
accepted path (compaction); drafters plug in through the tree expansion protocol."""

from __future__ import annotations

import pytest
import torch
from lightspec_tree.strategies import DynamicTree, StaticTree
from models import MaskIgnoringTarget, ToyTokenizer, cached_model, hf_greedy, make_prompts
from tree_helpers import LookupTreeDrafter

from lightspec_core import KVCache, LightSpecError, MTPPipeline, get_registry, hookimpl

N_NEW = 16
PROMPTS = make_prompts(8, seed=2)
STATIC = {"type": "static", "k": 8}


@pytest.fixture
def tree_forwards(monkeypatch):
    """For every KV-cache forward that carried a tree: how many nodes sit directly under its root."""
    seen = []
    forward = KVCache.forward

    def spy(self, input_ids, input_valid=None, tree=None, **kw):
        if tree is not None:
            seen.append(int((tree == -1).sum(1).max()))
        return forward(self, input_ids, input_valid, tree, **kw)

    monkeypatch.setattr(KVCache, "forward", spy)
    return seen


def _check(arch, strategy, prompts=PROMPTS, draft=None, budget=STATIC):
    model = cached_model(arch)
    pipe = MTPPipeline(model, ToyTokenizer(), strategy=strategy, budget=budget,
                       draft_model=draft if draft is not None else cached_model(arch, layers=1, seed=1))
    refs = [hf_greedy(model, p, N_NEW) for p in prompts]
    batch = pipe.generate(prompts, max_new_tokens=N_NEW, ignore_eos=True)
    assert [r.token_ids for r in batch] == refs, f"{arch}: batch of {len(prompts)} differs from HF greedy"
    solo = pipe.generate([prompts[1]], max_new_tokens=N_NEW, ignore_eos=True)[0]
    assert solo.token_ids == refs[1], f"{arch}: batch 1 differs from HF greedy"
    assert not any(r.stats.failures for r in batch), [r.stats.failures for r in batch]
    return pipe, batch


UNION = {"type": "combination", "kind": "union",
         "components": [{"type": "ngram", "max_draft": 4}, {"type": "dynamic_tree", "depth": 3, "top_k": 2}]}


@pytest.mark.parametrize("arch,strategy", [
    ("llama", {"type": "dynamic_tree", "adaptive": False}),
    ("llama", {"type": "static_tree", "drafter": "ngram", "adaptive": False}),
    ("llama", {"type": "dynamic_tree", "drafter": "layerskip", "depth": 4, "top_k": 3, "adaptive": False}),
    ("llama", UNION),
    ("qwen3", {"type": "dynamic_tree", "adaptive": False}),
    ("qwen3", UNION),
    ("mistral", {"type": "static_tree", "adaptive": False}),
    ("mistral", UNION),
    ("gemma", {"type": "dynamic_tree", "top_k": 3, "adaptive": False}),  # HF's forward for target and draft
    ("gemma", UNION),
])
def test_tree_strategies_are_lossless(arch, strategy, tree_forwards):
    from lightspec_core.strategy_files import build_strategy  # noqa: F401 - the test builds specs like the CLI

    obj = build_strategy(strategy, get_registry())
    pipe, batch = _check(arch, obj)
    assert max(tree_forwards, default=0) > 1, "no tree with several root children reached a model"
    assert sum(r.stats.drafted for r in batch) > 0


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_union_under_the_dynamic_budget_is_lossless(lazy):
    """``union`` under the core's ``dynamic`` budget: per-source caps for the components and,
    at batch 1, the free limit for the tree; every proposal passes the engine's checks (no
    failures) and the output is HF's.  ``lazy``: the draft model drafts only where the n-gram
    draft is short, so steps mix merged trees and n-gram chains."""
    spec = {"type": "combination", "kind": "union", "lazy": lazy,
            "components": [{"type": "ngram", "max_draft": 16}, {"type": "draft_model", "max_draft": 8}]}
    from lightspec_core.strategy_files import build_strategy

    for arch in ("llama", "qwen3"):
        _check(arch, build_strategy(spec, get_registry()), budget="dynamic")


@pytest.mark.parametrize("shape", ["static", "chain"])
def test_self_draft_accepts_whole_paths_and_the_drafter_keeps_them(monkeypatch, shape):
    """With the target as its own draft model, the tree's best path is always right: every
    step accepts its full depth, and after the commit the drafter's cache holds the accepted
    path, so its next catch-up runs only the last level's node and the bonus token (without
    ``tree_commit`` it would re-run the whole path: depth + 1 tokens).  ``chain``: a
    one-wide dynamic tree, whose nodes the drafter appends without re-running them."""
    model = cached_model("llama")
    choices = [[0], [1], [0, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]]
    strategy = (StaticTree(choices=choices, adaptive=False) if shape == "static"
                else DynamicTree(depth=4, top_k=1, adaptive=False))
    catch_up = []
    start = type(strategy.drafter).tree_start

    def spy(self, ctx):
        before = list(self.fed[0]) if self.fed else []
        out = start(self, ctx)
        common = 0
        while common < len(before) and before[common] == ctx.sequences[0][common]:
            common += 1
        catch_up.append(len(ctx.sequences[0]) - common)
        return out

    monkeypatch.setattr(type(strategy.drafter), "tree_start", spy)
    pipe = MTPPipeline(model, ToyTokenizer(), strategy=strategy, draft_model=model, budget={"type": "static", "k": 16})
    prompt = PROMPTS[1]
    out = pipe.generate([prompt], max_new_tokens=21, ignore_eos=True)[0]
    assert out.token_ids == hf_greedy(model, prompt, 21)
    # three full paths of 4; then max_new_tokens cuts the budget
    assert out.stats.steps == 5 and out.stats.accepted == 15 if shape == "static" else out.stats.accepted >= 15
    assert catch_up[0] == len(prompt) + 1 and catch_up[1:4] == [2, 2, 2], catch_up


def test_step_events_give_each_trees_depth():
    """The engine's step events carry each row's draft depth (its longest path), and the
    per-position statistics count a tree's levels: with the target as its own draft model
    every best path holds, so each 6-node tree of 4 levels accepts its depth (what the
    budget's acceptance model reads as no rejection, tests/test_budget.py)."""
    model = cached_model("llama")
    choices = [[0], [1], [0, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]]
    pipe = MTPPipeline(model, ToyTokenizer(), strategy=StaticTree(choices=choices, adaptive=False), draft_model=model,
                       budget={"type": "static", "k": 16})
    events = []
    pipe.bound.sinks.append(lambda event: events.append(event) if event.kind == "step" else None)
    out = pipe.generate([PROMPTS[1]], max_new_tokens=13, ignore_eos=True)[0]
    assert out.token_ids == hf_greedy(model, PROMPTS[1], 13)
    full = [e for e in events if e.drafted[0] == len(choices)]
    assert len(full) >= 2 and all(e.depth == [4] and e.accepted == [4] for e in full), \
        [(e.drafted, e.depth, e.accepted) for e in events]
    assert all(e.accepted[0] <= e.depth[0] <= e.drafted[0] for e in events)
    assert out.stats.per_position_drafted[:4] == out.stats.per_position_accepted[:4]
    assert len(out.stats.per_position_drafted) == 4  # levels, not nodes


def test_the_drafter_cache_after_compaction_gives_the_full_forward_logits(monkeypatch):
    """A dynamic tree's accepted path is rarely its first nodes: the drafter's ``KVCache.commit``
    compacts it.  With the target as its own draft model, every ``tree_start`` after such a
    commit must give the log-probabilities a full forward over the sequence gives."""
    from lightspec_tree.expanders import ModelExpander

    model = cached_model("llama")
    strategy = DynamicTree(depth=4, top_k=3, total_tokens=10, adaptive=False)
    checked, moved = [], []
    start, commit = ModelExpander.tree_start, ModelExpander.tree_commit

    def spy_start(self, ctx):
        out = start(self, ctx)
        with torch.inference_mode():
            for b, seq in enumerate(ctx.sequences):
                ref = torch.log_softmax(model(input_ids=torch.tensor([list(seq)])).logits[0, -1].float(), -1)
                torch.testing.assert_close(out[b], ref, atol=2e-3, rtol=2e-3)
                checked.append(len(seq))
        return out

    def spy_commit(self, path):
        moved.extend(p for p in path if p != list(range(len(p))))
        return commit(self, path)

    monkeypatch.setattr(ModelExpander, "tree_start", spy_start)
    monkeypatch.setattr(ModelExpander, "tree_commit", spy_commit)
    _check("llama", strategy, prompts=PROMPTS[:3], draft=model, budget={"type": "static", "k": 10})
    assert moved, "no accepted path needed compaction"
    assert len(checked) > 10


@pytest.mark.parametrize("layout", ["per_row", "holes"])
def test_the_draft_model_appends_each_level_without_re_running_the_tree(monkeypatch, layout):
    """Every ``tree_step`` of the draft model runs its F new nodes only (one forward of width
    F, ``tree_base`` covering the earlier levels), on both cache layouts: ``per_row``, a
    draft with LightSpec's CPU kernels (the chained lean forward, as the zoo draft runs);
    ``holes``, the same model as HF gives it.  Greedy output stays HF's at batch 8 and 1."""
    from lightspec_core.loading import install_cpu_kernels
    from lightspec_tree.expanders import ModelExpander
    from models import build_model

    draft = build_model("llama", layers=1, seed=1)
    if layout == "per_row":
        install_cpu_kernels(draft)
    widths, levels, layouts = [], [], set()
    step, forward = ModelExpander.tree_step, KVCache.forward
    inside = []

    def spy_step(self, tokens, parents):
        inside.append(tokens.shape[1])
        try:
            return step(self, tokens, parents)
        finally:
            inside.pop()
            layouts.add(self.kv.per_row)

    def spy_forward(self, input_ids, input_valid=None, tree=None, tree_base=None, **kw):
        if inside:
            widths.append((input_ids.shape[1], inside[-1]))
            if tree_base is not None:
                levels.append(tree.shape[1] - input_ids.shape[1])  # the tree's slots cached before it
        return forward(self, input_ids, input_valid, tree, tree_base=tree_base, **kw)

    monkeypatch.setattr(ModelExpander, "tree_step", spy_step)
    monkeypatch.setattr(KVCache, "forward", spy_forward)
    strategy = DynamicTree(depth=4, top_k=3, total_tokens=10, adaptive=False)
    _check("llama", strategy, draft=draft, budget={"type": "static", "k": 10})
    assert layouts == {layout == "per_row"}
    assert widths and all(q == f for q, f in widths), "a tree_step ran more than its new nodes"
    assert max(levels) >= 3 + 3, "no level was appended over two earlier levels"


def test_a_drafter_implementing_the_protocol_plugs_in_by_object_and_by_name():
    model = cached_model("llama")
    drafter = LookupTreeDrafter(model)  # the target itself: its best paths are right
    strategy = DynamicTree(drafter=drafter, depth=3, top_k=2, total_tokens=6, adaptive=False)
    pipe, batch = _check("llama", strategy, prompts=PROMPTS[:3])
    assert drafter.calls["tree_step"] > 0 and drafter.nodes > 0
    assert drafter.events >= max(r.stats.steps for r in batch)  # the strategy passes its step events on
    assert all(r.stats.mean_accepted_length > 2.5 for r in batch)

    class Plugin:
        @hookimpl
        def lightspec_register_strategies(self, register):
            register("lookup_tree_drafter", lambda: LookupTreeDrafter(model), params={})

    registry = get_registry()
    try:
        registry.add_plugin(Plugin(), "test_tree_drafter")
        strategy = DynamicTree(drafter="lookup_tree_drafter", depth=2, top_k=2, adaptive=False)
        assert isinstance(strategy.drafter, LookupTreeDrafter)
        _check("llama", strategy, prompts=PROMPTS[:2])
        with pytest.raises(ValueError, match="'none' does not implement the tree expansion protocol"):
            DynamicTree(drafter="none")
        with pytest.raises(ValueError, match="drafter='nope' is invalid: use draft_model, layerskip, ngram"):
            DynamicTree(drafter="nope")
    finally:
        get_registry(reload=True)


def test_eagle3_tree_needs_the_eagle3_plugin(monkeypatch):
    registry = get_registry()
    monkeypatch.delitem(registry.components, ("strategy", "eagle3"), raising=False)
    with pytest.raises(LightSpecError, match="the 'eagle3' drafter that eagle3_tree grows its trees from is not "
                                             "installed; .*lightspec-eagle3 plugin: pip install lightspec-eagle3"):
        MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="eagle3_tree")

    model = cached_model("llama")

    class FakeEagle3:
        @hookimpl
        def lightspec_register_strategies(self, register):
            register("eagle3", lambda: LookupTreeDrafter(model), params={})

    try:
        registry.add_plugin(FakeEagle3(), "fake_eagle3")
        pipe, batch = _check("llama", "eagle3_tree", prompts=PROMPTS[:2])
        assert isinstance(pipe.strategy.drafter, LookupTreeDrafter) and pipe.strategy.name == "eagle3_tree"
    finally:
        get_registry(reload=True)


@pytest.mark.parametrize("strategy", ["dynamic_tree", "static_tree"])
def test_a_target_without_tree_masks_is_refused_at_start_up(strategy, monkeypatch):
    import copy

    inner = copy.deepcopy(cached_model("gpt2"))
    target = MaskIgnoringTarget(inner).eval()
    from lightspec_core import TargetRunner

    assert not TargetRunner(target).supports_trees()
    with pytest.raises(LightSpecError, match=rf"strategy '{strategy}' drafts token trees, but this target \(gpt2\) "
                                             r"does not take the custom attention masks"):
        MTPPipeline(target, ToyTokenizer(), strategy=strategy, draft_model=cached_model("gpt2", layers=1, seed=1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_16_bit_every_suite_architecture_takes_trees_and_a_maskless_forward_is_still_refused(dtype):
    """The start-up probe compares a tree forward with a chain forward.  In 16-bit dtypes the two
    round differently; a float32 tolerance refused gemma, phi3 and gpt2 in bfloat16 (trees
    work on them in float32), so there the probe asks for agreement to rounding and a clear
    distance from what a forward that ignores the tree mask computes."""
    import copy

    from models import ARCHS

    from lightspec_core import TargetRunner

    for arch in ARCHS:
        model = copy.deepcopy(cached_model(arch)).to(dtype)
        assert TargetRunner(model).supports_trees(), arch
    maskless = MaskIgnoringTarget(copy.deepcopy(cached_model("gpt2")).to(dtype)).eval()
    assert not TargetRunner(maskless).supports_trees()
    out = MTPPipeline(copy.deepcopy(cached_model("gemma")).to(dtype), ToyTokenizer(), strategy="dynamic_tree",
                      draft_model=copy.deepcopy(cached_model("gemma", layers=1, seed=1)).to(dtype),
                      budget={"type": "static", "k": 4}).generate(make_prompts(2), max_new_tokens=8, ignore_eos=True)
    assert all(len(o.token_ids) == 8 for o in out) and sum(o.stats.drafted for o in out) > 0


def test_a_union_over_a_target_without_tree_masks_is_refused_at_start_up():
    import copy
    from pathlib import Path

    target = MaskIgnoringTarget(copy.deepcopy(cached_model("gpt2"))).eval()
    union = str(Path(__file__).resolve().parents[3] / "docs" / "examples" / "union_tree.yaml")
    with pytest.raises(LightSpecError, match=r"'union' combination merges drafts into a token tree, but this target "
                                             r"\(gpt2\) does not take the custom attention masks"):
        MTPPipeline(target, ToyTokenizer(), strategy=union, draft_model=cached_model("gpt2", layers=1, seed=1))


def test_bad_parameters_get_one_clear_error():
    with pytest.raises(ValueError, match="depth=0 is invalid"):
        DynamicTree(depth=0)
    with pytest.raises(ValueError, match="adaptive='yes' is invalid"):
        DynamicTree(adaptive="yes")
    with pytest.raises(ValueError, match="drafter_options=3 is invalid"):
        StaticTree(drafter_options=3)
    with pytest.raises(ValueError, match="drafter_options for 'ngram'.*max_gram"):
        StaticTree(drafter="ngram", drafter_options={"max_gram": 3})
    with pytest.raises(ValueError, match=r"needs its parent path \[1\]"):
        StaticTree(choices=[[0], [1, 0]])
