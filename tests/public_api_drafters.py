"""Two drafters written only against LightSpec's public API (``import lightspec_core`` and
its exported names), as a third-party EAGLE / tree plugin would write them.

* ``TreeLookupDrafter``: a token tree per row: the continuations of earlier occurrences of
  the row's last token (n-gram lookup, several branches) merged as a trie, plus the target's
  own greedy continuation as the *last* branch, so the verifier's accepted path is often not
  the first branch (the commit then compacts the KV cache).  It also asks for the target's
  final hidden states and checks that it gets those of every committed token, in order,
  accepted tree paths included.
* ``FeatureHeadDrafter``: EAGLE-style mechanics: a one-layer head (an HF decoder layer over
  ``fc([embedding(x_{t+1}); feature(x_t)])``, the target's final norm and lm_head) with its
  own ``KVCache``, fed with the target's hidden states that the engine hands over
  (``ctx.hidden_states`` / ``hidden_positions`` / ``hidden_lengths``), rolled back when the
  target rejects its drafts.  Its weights are random: it drafts badly, and losslessness is
  what the tests check.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from lightspec_core import DraftProposal, KVCache, final_norm, hookimpl


class TreeLookupDrafter:
    name = "tree_lookup"

    def __init__(self, model, width: int = 3, depth: int = 3, check_hidden: bool = True):
        self.model = model  # the target (for the reference branch and the hidden-state check)
        self.width, self.depth = width, depth
        n_layers = model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") else model.config.n_layer
        self.hidden_layers = [n_layers] if check_hidden else []
        self.states: dict[int, dict[int, torch.Tensor]] = {}  # request -> position -> final hidden state
        self.trees = self.nodes = 0

    def reset(self) -> None:
        self.states = {}

    @torch.inference_mode()
    def _greedy(self, seq: tuple[int, ...], n: int) -> list[int]:
        s = list(seq)
        for _ in range(n):
            s.append(int(self.model(input_ids=torch.tensor([s])).logits[0, -1].argmax()))
        return s[len(seq):]

    def _take_hidden(self, ctx) -> None:
        if not self.hidden_layers:
            return
        layer = self.hidden_layers[0]
        h = ctx.hidden_states[layer]
        for b, rid in enumerate(ctx.row_ids):
            first, n = int(ctx.hidden_positions[b]), int(ctx.hidden_lengths[b])
            assert first + n == len(ctx.sequences[b]) - 1, "states must reach the newest token the target ran"
            mine = self.states.setdefault(rid, {})
            assert first == len(mine), f"gap or overlap: have {len(mine)} states, got them from {first}"
            for j in range(n):
                mine[first + j] = h[b, j].clone()

    def check_states(self, request: int, seq: list[int]) -> None:
        """The collected states equal a reference forward's final hidden states."""
        layer = self.hidden_layers[0]
        mine = self.states[request]
        with torch.inference_mode():
            ref = self.model(input_ids=torch.tensor([seq[: len(mine)]]), output_hidden_states=True).hidden_states[layer][0]
        got = torch.stack([mine[i] for i in range(len(mine))])
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

    @hookimpl
    def lightspec_propose(self, ctx):
        self._take_hidden(ctx)
        tokens, parents = [], []
        for b, seq in enumerate(ctx.sequences):
            limit = ctx.max_draft_list[b]
            branches = []
            for i in range(len(seq) - 2, -1, -1):  # earlier occurrences of the last token, newest first
                if seq[i] == seq[-1] and len(branches) < self.width - 1:
                    branches.append(list(seq[i + 1 : i + 1 + self.depth]))
            ref = self._greedy(seq, self.depth)
            # a wrong first branch, so every tree has two branches at its root and the accepted
            # path (through the reference, listed last) is never the first one
            branches.insert(0, [(ref[0] + 1) % ctx.vocab_size])
            branches.append(ref)  # the target's own continuation, last
            nodes, pars, trie = [], [], {}
            for branch in branches:
                parent = -1
                for t in branch:
                    key = (parent, t)
                    if key not in trie:
                        if len(nodes) >= limit:
                            break
                        trie[key] = len(nodes)
                        nodes.append(t)
                        pars.append(parent)
                    parent = trie[key]
            tokens.append(nodes)
            parents.append(pars)
            self.trees += any(p == -1 for p in pars[1:])  # more than one branch at the root
            self.nodes += len(nodes)
        N = max(len(t) for t in tokens)
        if N == 0:
            return None
        pad = [t + [0] * (N - len(t)) for t in tokens]
        ppad = [p + [-1] * (N - len(p)) for p in parents]
        return DraftProposal(tokens=torch.tensor(pad, device=ctx.device), lengths=torch.tensor([len(t) for t in tokens]),
                             parents=torch.tensor(ppad, device=ctx.device), source=self.name)


class FeatureHead(nn.Module):
    """``fc [2H -> H]`` over ``[embedding(x_{t+1}); feature(x_t)]``, one Llama decoder layer,
    then the target's final norm and lm_head (shared, not copied)."""

    def __init__(self, target, seed: int = 0):
        super().__init__()
        t = target.config
        H = t.hidden_size
        cfg = LlamaConfig(hidden_size=H, intermediate_size=t.intermediate_size, num_attention_heads=t.num_attention_heads,
                          num_key_value_heads=getattr(t, "num_key_value_heads", t.num_attention_heads),
                          vocab_size=t.vocab_size, rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
                          attn_implementation="sdpa")
        self.embed = target.get_input_embeddings()
        with torch.random.fork_rng():  # deterministic weights without touching the caller's RNG
            torch.manual_seed(seed)
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(cfg)
        self.norm, self.head = final_norm(target), target.get_output_embeddings()
        self.config = cfg

    def forward(self, input_ids, features, position_ids, attention_mask, cache):
        x = self.fc(torch.cat([self.embed(input_ids), features], dim=-1))
        cos_sin = self.rotary(x, position_ids)
        out = self.layer(x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         use_cache=True, position_embeddings=cos_sin)
        h = out[0] if isinstance(out, tuple) else out
        return h, self.head(self.norm(h))


class _HeadModel(nn.Module):
    """What ``KVCache`` runs: the head as an HF-style forward (``input_ids``, masks, positions, cache)."""

    def __init__(self, head: FeatureHead):
        super().__init__()
        self.head, self.config = head, head.config
        self.features: torch.Tensor | None = None  # [B, q, H], set before each forward

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True, **_):
        B, q = input_ids.shape
        cols = past_key_values.get_seq_length() + q if past_key_values.layers else q
        mask = _mask_4d(attention_mask, B, q, cols, input_ids.device)
        h, logits = self.head(input_ids, self.features, position_ids, mask, past_key_values)
        return _Out(logits, h)


class _Out:
    def __init__(self, logits, hidden):
        self.logits, self.hidden = logits, hidden


def _mask_4d(mask, B, q, cols, device):
    """Causal over the cache's columns, and ``mask [B, cols]`` (valid columns) or a 4D mask as given."""
    if mask is not None and mask.dim() == 4:
        return mask
    col = torch.arange(cols, device=device)
    causal = col[None, :] <= (cols - q + torch.arange(q, device=device))[:, None]
    out = causal[None, None].expand(B, 1, q, cols)
    return out if mask is None else out & mask[:, None, None, :cols].bool()


class FeatureHeadDrafter:
    """EAGLE-style chain drafting from the target's final hidden states (module docstring)."""

    name = "feature_head"

    def __init__(self, target, max_draft: int = 3):
        self.target = target
        layers = target.config.num_hidden_layers
        self.hidden_layers = [layers]  # the final norm's output
        self.head = _HeadModel(FeatureHead(target)).eval()
        self.max_draft = max_draft
        self.kv: KVCache | None = None
        self.rows: list[int] = []
        self.fed: list[int] = []  # per row: tokens whose (token, feature) pairs are in the head's cache
        self.features: dict[int, dict[int, torch.Tensor]] = {}
        self.received = 0

    def reset(self) -> None:
        self.kv, self.rows, self.fed, self.features = None, [], [], {}

    @torch.inference_mode()
    @hookimpl
    def lightspec_propose(self, ctx):
        layer = self.hidden_layers[0]
        h = ctx.hidden_states[layer]
        for b, rid in enumerate(ctx.row_ids):  # keep every committed token's feature, by position
            first, n = int(ctx.hidden_positions[b]), int(ctx.hidden_lengths[b])
            mine = self.features.setdefault(rid, {})
            for j in range(n):
                mine[first + j] = h[b, j]
            self.received += n
        if self.kv is None or self.rows != list(ctx.row_ids):
            self.kv = KVCache(self.head, ctx.batch, ctx.device, capacity=64)
            self.rows, self.fed = list(ctx.row_ids), [0] * ctx.batch
        # catch up: pair token t+1 with the feature of token t, for every pair not yet fed
        seqs = ctx.sequences
        new = [list(range(self.fed[b], len(seqs[b]) - 1)) for b in range(ctx.batch)]  # positions t
        width = max(len(p) for p in new)
        if width == 0:
            return None
        H = h.shape[-1]
        ids = torch.zeros(ctx.batch, width, dtype=torch.long)
        feats = torch.zeros(ctx.batch, width, H)
        valid = torch.zeros(ctx.batch, width, dtype=torch.bool)
        for b, pos in enumerate(new):
            for j, t in enumerate(pos):
                ids[b, j], feats[b, j], valid[b, j] = seqs[b][t + 1], self.features[ctx.row_ids[b]][t], True
        self.head.features = feats
        out = self.kv.forward(ids, None if bool(valid.all()) else valid)
        self.fed = [len(s) - 1 for s in seqs]
        last = torch.tensor([len(p) - 1 for p in new]).clamp(min=0)
        rows = torch.arange(ctx.batch)
        feat, logits = out.hidden[rows, last], out.logits[rows, last]
        k = [min(self.max_draft, m) for m in ctx.max_draft_list]
        drafts = [[] for _ in k]
        for j in range(max(k)):
            tok = logits.argmax(-1)
            for b in range(ctx.batch):
                if j < k[b]:
                    drafts[b].append(int(tok[b]))
            if j + 1 == max(k):
                break
            self.head.features = feat[:, None]
            out = self.kv.forward(tok[:, None])
            feat, logits = out.hidden[:, 0], out.logits[:, 0]
        # the drafted pairs are not committed: roll the head's cache back to the fed tokens
        self.kv.truncate([f for f in self.fed])
        N = max(len(d) for d in drafts)
        if N == 0:
            return None
        return DraftProposal(tokens=torch.tensor([d + [0] * (N - len(d)) for d in drafts]),
                             lengths=torch.tensor([len(d) for d in drafts]), source=self.name)
