"""Engine behaviour: stop rules, streaming, fallback when a strategy raises, the batched
KV cache, hidden-state capture and the early-exit view.  (Over 400 lines: these share the
module's tiny model, its HF references and its drafters.)"""

from __future__ import annotations

import pytest
import torch
from helpers import ragged_append
from lightspec_core.interfaces import DraftProposal
from lightspec_core.kvcache import KVCache
from lightspec_core.model_parts import HiddenCapture, early_exit_view, final_norm, num_layers
from lightspec_core.verify import verify_chain
from models import ToyTokenizer, cached_model, hf_greedy, make_prompts

from lightspec_core import MTPPipeline, hookimpl

ARCH = "llama"
N_NEW = 24
PROMPTS = make_prompts(4, seed=3)
STATIC = {"type": "static", "k": 4}


@pytest.fixture(scope="module")
def tok():
    return ToyTokenizer()


@pytest.fixture(scope="module")
def model():
    return cached_model(ARCH)


@pytest.fixture(scope="module")
def refs(model):
    return [hf_greedy(model, p, N_NEW) for p in PROMPTS]


def self_draft_pipe(model, tok, **kw):
    """draft == target: greedy drafts are all accepted, so stops land inside accepted runs."""
    return MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget=STATIC, **kw)


# --- stop rules --------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["none", "self"])
def test_stop_on_eos_drops_tokens_after_it(model, tok, refs, strategy):
    ref = refs[0]
    eos = ref[9]
    cut = ref.index(eos) + 1
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [12345, eos]  # a list of eos ids
    try:
        pipe = self_draft_pipe(model, tok) if strategy == "self" else MTPPipeline(model, tok, strategy="none")
    finally:
        model.generation_config.eos_token_id = old
    assert eos in pipe.eos_ids
    out = pipe.generate(PROMPTS, max_new_tokens=N_NEW)
    assert out[0].token_ids == ref[:cut]
    assert out[0].finish_reason == "stop"
    assert out[0].stats.new_tokens == cut
    for o, r in zip(out[1:], refs[1:]):  # the other rows stop at their own eos, or run to the end
        c = next((j + 1 for j, t in enumerate(r) if t == eos), len(r))
        assert o.token_ids == r[:c]
    if strategy == "self":
        assert out[0].stats.accepted > 0
    # ignore_eos generates through it
    full = pipe.generate([PROMPTS[0]], max_new_tokens=N_NEW, ignore_eos=True)[0]
    assert full.token_ids == ref and full.finish_reason == "length"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 13])
def test_max_new_tokens_exact(model, tok, refs, n):
    pipe = self_draft_pipe(model, tok)
    out = pipe.generate(PROMPTS, max_new_tokens=n, ignore_eos=True)
    for o, r in zip(out, refs):
        assert o.token_ids == r[:n]
        assert o.finish_reason == "length"
        assert o.stats.new_tokens == n


def _stop_string(tok, ref, start):
    """A 2-3 character stop string that first completes at token ``start`` of ``ref``."""
    text = tok.decode(ref[: start + 1], skip_special_tokens=True)
    for width in (3, 2):
        s = text[-width:]
        prefix_text = tok.decode(ref[:start], skip_special_tokens=True)
        if s not in prefix_text:
            return s
    return None


@pytest.mark.parametrize("strategy", ["none", "self", "ngram"])
def test_stop_strings(model, tok, refs, strategy):
    ref = refs[1]
    stop = None
    for start in range(6, N_NEW - 2):
        stop = _stop_string(tok, ref, start)
        if stop:
            break
    assert stop, "no usable stop string in the reference"
    if strategy == "self":
        pipe = self_draft_pipe(model, tok)
    else:
        pipe = MTPPipeline(model, tok, strategy=strategy, budget=STATIC)
    out = pipe.generate([PROMPTS[1]], max_new_tokens=N_NEW, stop=[stop, "@@never@@"], ignore_eos=True)[0]
    # the shortest prefix of the reference whose text contains the stop string
    m = next(j for j in range(1, N_NEW + 1) if stop in tok.decode(ref[:j], skip_special_tokens=True))
    assert out.token_ids == ref[:m]
    assert stop in out.text and out.text.endswith(stop[-1])
    assert out.finish_reason == "stop"
    # a single str works as well
    again = pipe.generate([PROMPTS[1]], max_new_tokens=N_NEW, stop=stop, ignore_eos=True)[0]
    assert again.token_ids == ref[:m]


# --- streaming -------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["none", "self"])
def test_streaming_single(model, tok, strategy):
    pipe = self_draft_pipe(model, tok) if strategy == "self" else MTPPipeline(model, tok, strategy="none")
    prompt = "hello world hello"
    full = pipe.generate(prompt, max_new_tokens=N_NEW, ignore_eos=True)
    pieces = list(pipe.generate(prompt, max_new_tokens=N_NEW, ignore_eos=True, stream=True))
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == full.text
    assert len(pieces) > 1


def test_streaming_batch(model, tok):
    pipe = self_draft_pipe(model, tok)
    full = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    got = {i: "" for i in range(len(PROMPTS))}
    n = 0
    for item in pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True, stream=True):
        assert isinstance(item, tuple) and len(item) == 2
        i, piece = item
        got[i] += piece
        n += 1
    assert n > len(PROMPTS)
    assert [got[i] for i in range(len(PROMPTS))] == [o.text for o in full]


# --- fallback when a strategy raises -----------------------------------------------------


class FlakyDrafter:
    """Drafts the row's last token repeated (mostly rejected); raises on some steps."""

    name = "flaky"

    def __init__(self, fail_steps):
        self.fail_steps = set(fail_steps)
        self.calls = 0

    @hookimpl
    def lightspec_propose(self, ctx):
        self.calls += 1
        if ctx.step in self.fail_steps:
            raise RuntimeError("boom in propose")
        k = max(ctx.max_draft_list)
        if k == 0:
            return None
        last = torch.tensor([s[-1] for s in ctx.sequences], device=ctx.device)
        tokens = last[:, None].repeat(1, k)
        return DraftProposal(tokens=tokens, lengths=ctx.max_draft.clone(), source=self.name)


class FlakyVerifier:
    name = "flaky_verify"

    def __init__(self, fail_steps):
        self.fail_steps = set(fail_steps)

    @hookimpl
    def lightspec_verify(self, ctx, proposal, output):
        if ctx.step in self.fail_steps:
            raise ValueError("boom in verify")
        return verify_chain(ctx, proposal, output.logits)


def test_propose_failure_falls_back(model, tok, refs, caplog):
    strat = FlakyDrafter(fail_steps={2, 3, 7})
    pipe = MTPPipeline(model, tok, strategy=strat, budget=STATIC)
    with caplog.at_level("WARNING"):
        out = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    assert strat.calls > 3
    for o, r in zip(out, refs):
        assert o.token_ids == r
        assert o.stats.failures, "the failure is not in the request statistics"
        assert any("propose" in f and "boom in propose" in f for f in o.stats.failures)
    assert "boom in propose" in caplog.text


def test_verify_failure_falls_back(model, tok, refs, caplog):
    verifier = FlakyVerifier(fail_steps={1, 4})
    pipe = MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget=STATIC, verifier=verifier)
    with caplog.at_level("WARNING"):
        out = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    for o, r in zip(out, refs):
        assert o.token_ids == r
        assert any("verify" in f and "boom in verify" in f for f in o.stats.failures)
        assert o.stats.accepted > 0  # the other steps still speculated
    assert "boom in verify" in caplog.text


def test_failure_under_sampling_keeps_going(model, tok):
    strat = FlakyDrafter(fail_steps={1, 2})
    pipe = MTPPipeline(model, tok, strategy=strat, budget=STATIC)
    out = pipe.generate(PROMPTS, max_new_tokens=10, temperature=0.8, seed=1, ignore_eos=True)
    assert all(len(o.token_ids) == 10 and o.stats.failures for o in out)


# --- KVCache ---------------------------------------------------------------------------


def full_last_logits(model, seq):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([seq])).logits[0, -1]


def check_rows(model, kv_logits, seqs, atol=1e-4):
    for b, seq in enumerate(seqs):
        torch.testing.assert_close(kv_logits[b], full_last_logits(model, seq), atol=atol, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "opt", "gpt_neox"])
@torch.inference_mode()
def test_batched_kv_truncate_compact_select(arch):
    model = cached_model(arch)
    g = torch.Generator().manual_seed(0)
    lens = [5, 17, 2, 11]
    seqs = [torch.randint(3, 500, (n,), generator=g).tolist() for n in lens]
    B = len(seqs)
    kv = KVCache(model, B, torch.device("cpu"), capacity=8)  # small: forces growth
    width = max(lens)
    ids = torch.zeros(B, width, dtype=torch.long)
    valid = torch.zeros(B, width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        valid[b, : len(s)] = True
    out = kv.forward(ids, valid)
    check_rows(model, out.logits[torch.arange(B), torch.tensor(lens) - 1], seqs)
    assert kv.npos.tolist() == lens

    for rnd in range(12):
        # append a ragged "verify" block: row b gets q_b new tokens (then padding)
        q, new, valid = ragged_append(B, rnd, g)
        before = kv.npos.clone()
        out = kv.forward(new, valid)
        for b in range(B):
            for j in range(q[b]):  # every real slot's logits equal a full forward
                torch.testing.assert_close(out.logits[b, j], full_last_logits(model, seqs[b] + new[b, : j + 1].tolist()),
                                           atol=1e-4, rtol=1e-4)
        # keep a ragged prefix of what was appended (a rollback of rejected tokens)
        keep_new = [(b * 7 + rnd * 3) % (q[b] + 1) for b in range(B)]
        kv.truncate(before + torch.tensor(keep_new))
        for b in range(B):
            seqs[b] = seqs[b] + new[b, : keep_new[b]].tolist()
        assert kv.npos.tolist() == [len(s) for s in seqs]
        if rnd == 5:
            kv.compact()
            assert kv.npos.tolist() == [len(s) for s in seqs]
            assert kv.cols == max(len(s) for s in seqs)
        if rnd == 8:  # drop a row and reorder the rest
            keep = torch.tensor([3, 0, 2])
            kv.select_rows(keep)
            seqs = [seqs[i] for i in keep.tolist()]
            B = len(seqs)
    # one plain step per row checks the final state
    nxt = torch.randint(3, 500, (B, 1), generator=g)
    out = kv.forward(nxt)
    check_rows(model, out.logits[:, -1], [s + [int(t)] for s, t in zip(seqs, nxt[:, 0])])


@torch.inference_mode()
def test_batched_kv_batch1_fast_truncate():
    model = cached_model("qwen2")
    seq = list(range(10, 30))
    kv = KVCache(model, 1, torch.device("cpu"), capacity=64)
    kv.forward(torch.tensor([seq]))
    kv.forward(torch.tensor([[40, 41, 42]]))
    kv.truncate(torch.tensor([len(seq) + 1]))  # keep only 40
    assert kv.cols == len(seq) + 1 and not kv.has_holes
    out = kv.forward(torch.tensor([[43]]))
    check_rows(model, out.logits[:, -1], [seq + [40, 43]])


# --- hidden states and early exit ----------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "qwen3", "opt", "phi3", "gemma"])
@torch.inference_mode()
def test_hidden_capture_matches_output_hidden_states(arch):
    model = cached_model(arch)
    n = num_layers(model)
    ids = torch.randint(3, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    want = [0, 1, n - 1, n]
    cap = HiddenCapture(model, want)
    try:
        out = model(input_ids=ids, output_hidden_states=True)
    finally:
        cap.remove()
    assert sorted(cap.states) == sorted(set(want))
    for i in want:
        torch.testing.assert_close(cap.states[i], out.hidden_states[i], atol=1e-5, rtol=1e-5, msg=f"layer {i}")
    # removed hooks record nothing more
    cap.states.clear()
    model(input_ids=ids)
    assert cap.states == {}
    with pytest.raises(ValueError):
        HiddenCapture(model, [n + 1])


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "qwen3", "opt", "phi3"])
@pytest.mark.parametrize("L", [1, 2])
@torch.inference_mode()
def test_early_exit_view_logits(arch, L):
    model = cached_model(arch)
    ids = torch.randint(3, 500, (2, 7), generator=torch.Generator().manual_seed(2))
    view = early_exit_view(model, L)
    got = view(input_ids=ids).logits
    full = model(input_ids=ids, output_hidden_states=True)
    manual = model.get_output_embeddings()(final_norm(model)(full.hidden_states[L]))
    torch.testing.assert_close(got, manual, atol=1e-5, rtol=1e-5)
    # the target itself is untouched and shares weights with the view
    assert num_layers(model) == 3
    assert view.get_output_embeddings() is model.get_output_embeddings()
    torch.testing.assert_close(model(input_ids=ids).logits, full.logits)
    with pytest.raises(ValueError):
        early_exit_view(model, 4)


class HiddenProbe:
    """A drafter that asks for hidden layers and checks what the engine hands it against
    a full forward of the row's context."""

    name = "probe"

    def __init__(self, model, layers):
        self.model = model
        self.hidden_layers = layers
        self.checked = 0

    @hookimpl
    def lightspec_propose(self, ctx):
        assert sorted(ctx.hidden_states) == sorted(self.hidden_layers)
        with torch.inference_mode():
            for b, seq in enumerate(ctx.sequences):
                ref = self.model(input_ids=torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
                first, n = int(ctx.hidden_positions[b]), int(ctx.hidden_lengths[b])
                # the states of the tokens committed since the last propose, up to the newest one the target ran
                assert first + n == len(seq) - 1 and n >= 1
                for i in self.hidden_layers:
                    h = ctx.hidden_states[i]
                    assert h.shape[0] == ctx.batch and h.shape[1] >= n
                    torch.testing.assert_close(h[b, :n], ref[i][0, first:first + n], atol=1e-4, rtol=1e-4)
                    self.checked += 1
        # draft the target's own greedy continuation for row b's first token, to exercise q > 1 forwards
        k = max(ctx.max_draft_list)
        if k == 0:
            return None
        tokens = torch.zeros(ctx.batch, k, dtype=torch.long)
        with torch.inference_mode():
            for b, seq in enumerate(ctx.sequences):
                s = list(seq)
                for j in range(ctx.max_draft_list[b]):
                    t = int(self.model(input_ids=torch.tensor([s])).logits[0, -1].argmax()) if j % 2 == 0 else 7
                    tokens[b, j] = t
                    s.append(t)
        return DraftProposal(tokens=tokens, lengths=ctx.max_draft.clone(), source=self.name)


def test_engine_captures_requested_hidden_states(model, tok, refs):
    probe = HiddenProbe(model, [1, 3])
    pipe = MTPPipeline(model, tok, strategy=probe, budget={"type": "static", "k": 3})
    out = pipe.generate(PROMPTS, max_new_tokens=10, ignore_eos=True)
    assert [o.token_ids for o in out] == [r[:10] for r in refs]
    assert probe.checked > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_runs(tok, dtype):
    """bf16/fp16 models: plain decoding through the engine equals HF at batch 1;
    speculation runs and emits exactly max_new_tokens (exact equality with
    speculation is only promised in fp32: a k-token forward may flip a near-tie)."""
    import copy

    model = copy.deepcopy(cached_model("gpt2")).to(dtype)
    prompts = PROMPTS[:2]
    plain = MTPPipeline(model, tok, strategy="none")
    for p in prompts:
        assert plain.generate([p], max_new_tokens=12, ignore_eos=True)[0].token_ids == hf_greedy(model, p, 12)
    spec = MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget=STATIC)
    out = spec.generate(prompts, max_new_tokens=12, ignore_eos=True)
    assert all(len(o.token_ids) == 12 for o in out)
    assert sum(o.stats.accepted for o in out) > 0


class MalformedDrafter:
    """Returns a proposal the engine must reject (then decode plainly for that step)."""

    name = "malformed"

    def __init__(self, kind):
        self.kind = kind

    @hookimpl
    def lightspec_propose(self, ctx):
        B, k = ctx.batch, max(ctx.max_draft_list)
        if k == 0:
            return None
        tokens = torch.full((B, k), 5, dtype=torch.long)
        lengths = ctx.max_draft.clone()
        if self.kind == "too_long":
            lengths = lengths + 1
            tokens = torch.full((B, k + 1), 5, dtype=torch.long)
        elif self.kind == "bad_ids":
            tokens[:, 0] = 10_000
        elif self.kind == "wrong_rows":
            tokens, lengths = tokens[:1].repeat(B + 1, 1), lengths[:1].repeat(B + 1)
        return DraftProposal(tokens=tokens, lengths=lengths, source=self.name)


@pytest.mark.parametrize("kind", ["too_long", "bad_ids", "wrong_rows"])
def test_malformed_proposal_falls_back(model, tok, refs, kind):
    pipe = MTPPipeline(model, tok, strategy=MalformedDrafter(kind), budget=STATIC)
    out = pipe.generate(PROMPTS, max_new_tokens=8, ignore_eos=True)
    for o, r in zip(out, refs):
        assert o.token_ids == r[:8]
        assert o.stats.failures and all("propose failed" in f for f in o.stats.failures)
        assert o.stats.accepted == 0


def test_streaming_with_stop_and_eos(model, tok, refs):
    pipe = self_draft_pipe(model, tok)
    ref = refs[2]
    eos = ref[12]
    pipe.eos_ids = {eos}
    full = pipe.generate([PROMPTS[2], PROMPTS[3]], max_new_tokens=N_NEW)
    got = ["", ""]
    for i, piece in pipe.generate([PROMPTS[2], PROMPTS[3]], max_new_tokens=N_NEW, stream=True):
        got[i] += piece
    assert got == [o.text for o in full]
    assert full[0].token_ids == ref[: ref.index(eos) + 1]


class NegPaddedDrafter:
    """Row 0 drafts (repeats of its last token), the other rows draft nothing; padding
    slots hold -1 (the convention VerifyResult uses). interfaces.DraftProposal says row b's
    draft is ``tokens[b, :lengths[b]]`` and the rest is padding, so its value must not matter."""

    name = "negpad"

    @hookimpl
    def lightspec_propose(self, ctx):
        B, k = ctx.batch, max(ctx.max_draft_list)
        if k == 0:
            return None
        tokens = torch.full((B, k), -1, dtype=torch.long)
        lengths = torch.zeros(B, dtype=torch.long)
        tokens[0, : ctx.max_draft_list[0]] = ctx.sequences[0][-1]
        lengths[0] = ctx.max_draft_list[0]
        return DraftProposal(tokens=tokens, lengths=lengths, source=self.name)


def test_proposal_padding_value_is_ignored(model, tok, refs):
    pipe = MTPPipeline(model, tok, strategy=NegPaddedDrafter(), budget=STATIC)
    out = pipe.generate(PROMPTS, max_new_tokens=8, ignore_eos=True)
    assert [o.token_ids for o in out] == [r[:8] for r in refs]
    assert not any(o.stats.failures for o in out), out[0].stats.failures[:1]
    assert out[0].stats.drafted > 0


def _padded_pair(target_vocab, draft_vocab):
    """A target and a draft that share a 512-token tokenizer but whose embedding/lm_head
    sizes are padded differently (as in real model families, e.g. 151936 vs 152064).
    Padded lm_head rows are zero, so those ids are never the argmax / never in top-k."""
    from models import build_model

    big, small = max(target_vocab, draft_vocab), min(target_vocab, draft_vocab)
    src = build_model("llama", vocab_size=big)
    with torch.no_grad():
        src.lm_head.weight[512:] = 0
    other = build_model("llama", vocab_size=small)
    with torch.no_grad():
        for (_n, p), (_, q) in zip(other.named_parameters(), src.named_parameters()):
            p.copy_(q[: p.shape[0]] if p.shape != q.shape else q)
    return (src, other) if target_vocab == big else (other, src)


@pytest.mark.parametrize("target_vocab,draft_vocab", [(576, 512), (512, 576)])
def test_draft_model_with_differently_padded_vocab(tok, target_vocab, draft_vocab):
    target, draft = _padded_pair(target_vocab, draft_vocab)
    pipe = MTPPipeline(target, tok, strategy="draft_model", draft_model=draft, budget=STATIC)
    greedy = pipe.generate(PROMPTS[:2], max_new_tokens=10, ignore_eos=True)
    assert [o.token_ids for o in greedy] == [hf_greedy(target, p, 10) for p in PROMPTS[:2]]
    assert not any(o.stats.failures for o in greedy)
    out = pipe.generate(PROMPTS, max_new_tokens=10, temperature=1.0, top_k=20, seed=3, ignore_eos=True)
    failures = [f for o in out for f in o.stats.failures]
    assert not failures, failures[0]
    assert sum(o.stats.accepted for o in out) > 0


def test_draft_model_max_context_feeds_only_the_prompt_tail(model, tok, refs):
    """``max_context=N``: the draft's cache starts from each prompt's last N tokens (its
    prefill is paid before the first draft); drafts still follow the accepted prefix,
    and the output is the target's own greedy output either way."""
    n = 6
    pipe = MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget=STATIC, max_context=n)
    out = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    drafter = pipe.strategy
    assert drafter.kv is not None
    longest = max(len(p) for p in PROMPTS)
    # the last batch left the cache: at most n prompt tokens per row plus what was generated
    assert int(drafter.kv.npos.max()) <= n + N_NEW + drafter.max_draft
    assert int(drafter.kv.npos.max()) < longest + N_NEW
    whole = MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget=STATIC, max_context=0)
    assert [o.token_ids for o in whole.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)] == refs
    assert int(whole.strategy.kv.npos.max()) >= longest
    with pytest.raises(Exception, match="max_context=-1 is invalid"):
        MTPPipeline(model, tok, strategy="draft_model", draft_model=model, max_context=-1)


def test_draft_model_batch_context_shrinks_the_draft_prefill_with_the_batch():
    """``batch_context``: the prompt tails of a batch hold at most that many tokens
    together (16 per row at least), so the draft's prefill does not grow with the batch."""
    from lightspec_core.strategies.model_drafter import ModelDrafter

    d = ModelDrafter(max_context=128, batch_context=256)
    assert [d.context_span(b) for b in (1, 2, 4, 8, 64)] == [128, 128, 64, 32, 16]
    assert ModelDrafter(max_context=0, batch_context=256).context_span(1) == 256
    assert ModelDrafter(max_context=64, batch_context=0).context_span(8) == 64
    assert ModelDrafter(max_context=0, batch_context=0).context_span(8) == 0  # the whole prompt
    with pytest.raises(ValueError, match="batch_context=-1 is invalid"):
        ModelDrafter(batch_context=-1)


class LooseBudget:
    """k = 2 for every row, and a looser limit of 6 for model-free drafters."""

    name = "loose"

    @hookimpl
    def lightspec_budget(self, ctx):
        from lightspec_core import Budget

        B = ctx.batch
        return Budget(max_draft=torch.full((B,), 2, dtype=torch.long), min_confidence=torch.zeros(B),
                      free_max_draft=[6] * B)


class OracleFreeDrafter:
    """Drafts the reference continuation, up to the free limit (plus ``extra``)."""

    name = "oracle_free"

    def __init__(self, refs, prompts, extra: int = 0):
        self.refs, self.prompts, self.extra = refs, prompts, extra
        self.seen_free: list[int] = []

    @hookimpl
    def lightspec_propose(self, ctx):
        B = ctx.batch
        free = ctx.free_max_draft_list
        assert free is not None and all(f >= m for f, m in zip(free, ctx.max_draft_list))
        self.seen_free += free
        drafts = []
        for b, rid in enumerate(ctx.row_ids):
            done = len(ctx.sequences[b]) - len(self.prompts[rid])
            drafts.append(self.refs[rid][done : done + free[b] + self.extra])
        k = max(len(d) for d in drafts)
        tokens = torch.zeros(B, max(k, 1), dtype=torch.long)
        for b, d in enumerate(drafts):
            tokens[b, : len(d)] = torch.tensor(d, dtype=torch.long)
        return DraftProposal(tokens=tokens, lengths=torch.tensor([len(d) for d in drafts]), source=self.name)


def test_a_budget_free_limit_lets_model_free_drafters_go_past_k(model, tok, refs):
    drafter = OracleFreeDrafter(refs, PROMPTS)
    pipe = MTPPipeline(model, tok, strategy=drafter, budget=LooseBudget())
    out = pipe.generate(PROMPTS[:1], max_new_tokens=N_NEW, ignore_eos=True)
    assert out[0].token_ids == refs[0][:N_NEW]
    assert not out[0].stats.failures
    assert max(drafter.seen_free) == 6 and sum(out[0].stats.per_position_accepted[2:]) > 0  # accepted past k = 2
    # past the free limit: rejected, that step decodes plainly
    over = MTPPipeline(model, tok, strategy=OracleFreeDrafter(refs, PROMPTS, extra=1), budget=LooseBudget())
    out = over.generate(PROMPTS[:1], max_new_tokens=8, ignore_eos=True)
    assert out[0].token_ids == refs[0][:8]
    assert out[0].stats.failures and "allowed 0..6" in out[0].stats.failures[0]
