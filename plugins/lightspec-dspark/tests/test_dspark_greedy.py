"""The ``dspark`` / ``dflash`` strategies are lossless: greedy output token-identical to HF greedy
(fp32) at batch 1 and 8, for every Markov head type, flat and nested configs, a reduced draft
vocabulary, and they draft blocks (the test would not notice a strategy that never drafts
otherwise)."""

from __future__ import annotations

import pytest
import torch
from dspark_fixtures import ToyTok, hf_greedy, prompts, tiny_target, write_checkpoint

from lightspec_core import MTPPipeline

N_NEW = 12




CASES = {
    "vanilla": dict(markov_type="vanilla"),
    "gated": dict(markov_type="gated", nested=True),
    "rnn": dict(markov_type="rnn"),
    "no_conf_markov": dict(with_markov=False),
    "dflash": dict(kind="dflash"),
    "reduced_vocab": dict(draft_vocab=48),
}


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_matches_hf_at_batch_1_and_8(tmp_path, target, case):
    ckpt = write_checkpoint(tmp_path / case, target, **CASES[case])
    strategy = "dflash" if case == "dflash" else "dspark"
    pipe = MTPPipeline(target, ToyTok(), strategy=strategy, checkpoint=str(ckpt), budget={"type": "static", "k": 4})
    ps = prompts(8, seed=3)
    refs = [hf_greedy(target, p, N_NEW) for p in ps]
    one = pipe.generate([ps[0]], max_new_tokens=N_NEW, ignore_eos=True)[0]
    assert one.token_ids == refs[0]
    out = pipe.generate(ps, max_new_tokens=N_NEW, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    assert sum(o.stats.drafted for o in out) > 0
    assert not any(o.stats.failures for o in out), [o.stats.failures for o in out]


def test_inference_block_equals_the_training_layout(tmp_path, target):
    """The strategy's first block (context from the engine's hidden states, kept per row) equals
    the block the trainer computes for the same anchor over the whole sequence (context columns
    before the anchor, the block non-causal): the drafter is used as it is trained."""
    from lightspec_dspark.strategy import DSparkStrategy
    from lightspec_dspark.train import block_mask

    ckpt = write_checkpoint(tmp_path, target, markov_type="rnn")
    seen = []

    class Recording(DSparkStrategy):
        def lightspec_propose(self, ctx):
            p = super().lightspec_propose(ctx)
            seen.append((tuple(ctx.sequences[0]), p.tokens[0, : int(p.lengths[0])].tolist()))
            return p

    strat = Recording(checkpoint=str(ckpt))
    prompt = prompts(2, seed=5)[1]
    MTPPipeline(target, ToyTok(), strategy=strat, budget={"type": "static", "k": 4}).generate(
        [prompt], max_new_tokens=6, ignore_eos=True)
    d = strat.drafter
    for seq, drafted in seen[:3]:
        ids = torch.tensor([seq])
        a = len(seq) - 1
        with torch.no_grad():
            hs = target(input_ids=ids, output_hidden_states=True).hidden_states
            taps = torch.cat([hs[i + 1] for i in d.cfg.target_layer_ids], dim=-1)
            kv = d.context_kv(d.features(taps), torch.arange(len(seq))[None])
            block = torch.tensor([[seq[-1]] + [d.cfg.mask_token_id] * 3])
            h = d.backbone(block, torch.arange(a, a + 4)[None], kv, block_mask(torch.tensor([[a]]), len(seq), 4))
            base = d.base_logits(h)
            prev, state, ref = torch.tensor([seq[-1]]), None, []
            for k in range(4):
                bias, state = d.markov_head.step(prev, h[:, k], state)
                prev = (base[:, k] + bias).argmax(-1)
                ref.append(int(prev))
        assert drafted == ref[: len(drafted)] and drafted


def test_zoo_target_finds_the_zoo_head():
    """``dspark`` without a checkpoint on the zoo target uses the head shipped in the zoo; on
    another target it asks for a checkpoint."""
    import lightspec_zoo
    from lightspec_core.pipeline import load_model
    from lightspec_dspark.strategy import DSparkStrategy, zoo_head_for

    from lightspec_core import LightSpecError

    zoo = load_model(lightspec_zoo.model_path(), torch.device("cpu"), torch.float32)
    head = zoo_head_for(zoo)
    assert head == lightspec_zoo.MODELS_DIR / "dspark"
    strat = DSparkStrategy()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(lightspec_zoo.model_path())
    pipe = MTPPipeline(zoo, tok, strategy=strat, budget={"type": "static", "k": 6})
    assert strat.path == str(head)
    out = pipe.generate("def add(a, b):\n    return", max_new_tokens=24, ignore_eos=True)
    assert out.token_ids == hf_greedy(zoo, tok("def add(a, b):\n    return")["input_ids"], 24)
    assert out.stats.accepted > 0  # the trained head drafts tokens the target keeps
    with pytest.raises(LightSpecError, match="checkpoint=PATH"):
        MTPPipeline(tiny_target("llama"), ToyTok(), strategy="dspark")
    # the zoo's plain draft LM (what from_pretrained() passes by default) is no DSpark folder:
    # the zoo head is still found; on another target the error names the draft model
    pipe = MTPPipeline(zoo, tok, strategy="dspark", draft_model=str(lightspec_zoo.model_path("draft")))
    with pytest.raises(LightSpecError, match="no DSpark/DFlash folder"):
        MTPPipeline(tiny_target("llama"), ToyTok(), strategy="dspark", draft_model=str(lightspec_zoo.model_path("draft")))
