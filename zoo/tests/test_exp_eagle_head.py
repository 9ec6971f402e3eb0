"""The EAGLE-style head experiment (zoo/scripts/exp_eagle_head.py): training must see what drafting sees."""
from __future__ import annotations

import pytest
import torch
from zoo_scripts import load_script

eh = load_script("exp_eagle_head")


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
    target = LlamaForCausalLM(cfg).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    head = eh.make_head(target)
    with torch.no_grad():  # a random head, not the zero-ish init, so that every path matters
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return target, head


def test_feature_layers():
    assert eh.feature_layers(7) == (2, 4, 7)
    assert eh.feature_layers(3) == (1, 2, 3)


def test_unrolled_training_matches_incremental_drafting(tiny):
    """Step s of the unrolled (training-time test) forward at index t must equal the s-th logits of a
    draft chain started after token t+1 and fed the true tokens: same keys, positions and features."""
    target, head = tiny
    embed, lm_head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    ids = torch.randint(0, 97, (1, 24))
    with torch.no_grad():
        feats, _ = eh.target_features(target, ids)
        unrolled = eh.ttt_forward(head, embed, lm_head, feats, ids, steps=3)
    assert [u.shape[1] for u in unrolled] == [23, 22, 21]
    for t in (0, 5, 17):
        # the target has run over tokens 0..t and emitted token t+1
        chain = list(eh.chain_logits(head, embed, lm_head, feats[:, : t + 1], ids[:, : t + 2], ids[0, t + 2 : t + 4]))
        assert len(chain) == 3
        for s in range(3):
            torch.testing.assert_close(chain[s], unrolled[s][0, t], rtol=1e-4, atol=1e-4)


def test_head_chain_counts_matches_until_the_first_miss(tiny):
    target, head = tiny
    embed, lm_head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        feats, _ = eh.target_features(target, ids)
    greedy = []  # the head's own greedy chain: all of it matches
    gen = eh.chain_logits(head, embed, lm_head, feats[:, :9], ids[:, :10], torch.tensor([], dtype=torch.long))
    greedy.append(int(next(gen).argmax()))
    for _ in range(3):
        logits = list(eh.chain_logits(head, embed, lm_head, feats[:, :9], ids[:, :10], torch.tensor(greedy)))[-1]
        greedy.append(int(logits.argmax()))
    truth = torch.tensor(greedy)
    assert eh.head_chain(head, embed, lm_head, feats[:, :9], ids[:, :10], truth, k=4) == 4
    assert eh.head_chain(head, embed, lm_head, feats[:, :9], ids[:, :10], truth, k=2) == 2
    wrong = truth.clone()
    wrong[2] = (wrong[2] + 1) % 97
    assert eh.head_chain(head, embed, lm_head, feats[:, :9], ids[:, :10], wrong, k=4) == 2


def test_training_steps_lower_the_loss(tiny):
    target, _ = tiny
    torch.manual_seed(1)
    head = eh.make_head(target)
    embed, lm_head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    ids = torch.randint(0, 97, (4, 32))
    with torch.no_grad():
        feats, tlogits = eh.target_features(target, ids)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss, agree = eh.ttt_loss(head, embed, lm_head, feats, tlogits, ids, steps=3)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert len(agree) == 3
    assert loss.item() < 0.7 * first
