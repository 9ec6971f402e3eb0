"""``dspark`` inside a composition: on steps where the drafts before it fill the budget it is
called with a zero budget only to hand over the target's new hidden states; it keeps them
unprocessed and ingests them all at its next draft.  Its drafts then equal the drafter run on
the whole sequence (as ``test_inference_block_equals_the_training_layout`` checks a lone
``dspark``), and the output stays the target's own."""

from __future__ import annotations

import pytest
import torch
from dspark_fixtures import ToyTok, hf_greedy, prompts, tiny_target, write_checkpoint
from lightspec_core.composer import Combination

from lightspec_core import DraftProposal, MTPPipeline, get_registry


class EveryOtherStep:
    """A free first component: on every other step it fills the row's whole budget with a
    draft the target rejects (token 1), on the others it drafts nothing."""

    name = "every_other"

    def __init__(self):
        self.calls = 0

    def draft_cost_hints(self):
        return {self.name: 0.0}

    def lightspec_propose(self, ctx):
        self.calls += 1
        if self.calls % 2:
            return None
        k = max(ctx.max_draft_list)
        return DraftProposal(tokens=torch.ones(ctx.batch, k, dtype=torch.long), lengths=torch.tensor(ctx.max_draft_list))


def reference_block(d, target, seq: list[int], width: int) -> list[int]:
    """The drafter's greedy block after ``seq``, its context computed from the whole sequence."""
    from lightspec_dspark.train import block_mask

    a = len(seq) - 1
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i + 1] for i in d.cfg.target_layer_ids], dim=-1)
        kv = d.context_kv(d.features(taps), torch.arange(len(seq))[None])
        block = torch.tensor([[seq[-1]] + [d.cfg.mask_token_id] * (width - 1)])
        h = d.backbone(block, torch.arange(a, a + width)[None], kv, block_mask(torch.tensor([[a]]), len(seq), width))
        base = d.base_logits(h)
        prev, state, out = torch.tensor([seq[-1]]), None, []
        for k in range(width):
            bias, state = d.markov_head.step(prev, h[:, k], state)
            prev = (base[:, k] + bias).argmax(-1)
            out.append(int(prev))
    return out


@pytest.mark.parametrize("max_pending", [64, 1])
def test_a_skipped_dspark_ingests_the_kept_states_at_its_next_draft(tmp_path, monkeypatch, max_pending):
    import lightspec_dspark.strategy as strategy_module
    from lightspec_dspark.strategy import DSparkStrategy

    monkeypatch.setattr(strategy_module, "MAX_PENDING", max_pending)

    target = tiny_target("qwen3")
    ckpt = write_checkpoint(tmp_path, target, markov_type="vanilla")
    seen, skipped = [], []

    class Recording(DSparkStrategy):
        def lightspec_propose(self, ctx):
            p = super().lightspec_propose(ctx)
            if max(ctx.max_draft_list) == 0:
                skipped.append(len(self.pending))
            elif p is not None:
                assert self.pending == []  # a draft ingests every kept state first
                seen.append((list(ctx.sequences[0]), p.tokens[0, : int(p.lengths[0])].tolist()))
            return p

    dspark = Recording(checkpoint=str(ckpt))
    cascade = Combination("c", "cascade", [EveryOtherStep(), dspark], get_registry().create("fusion", "concat"))
    prompt = prompts(2, seed=5)[1]
    out = MTPPipeline(target, ToyTok(), strategy=cascade, budget={"type": "static", "k": 3}).generate(
        [prompt], max_new_tokens=10, ignore_eos=True)[0]
    assert out.token_ids == hf_greedy(target, prompt, 10)
    assert not out.stats.failures, out.stats.failures
    assert skipped and max(skipped) == (1 if max_pending > 1 else 0)  # kept, or ingested at once with 1
    assert len(seen) >= 2
    for seq, drafted in seen:
        assert drafted == reference_block(dspark.drafter, target, seq, 3)[: len(drafted)] and drafted
