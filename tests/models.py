"""Shared helpers for the engine tests: tiny HF causal LMs built from configs, a toy
tokenizer, and HF ``generate`` references.

Nothing is downloaded: every model is a randomly initialised tiny config.  A large
``initializer_range`` (0.2) spreads the logits so that fp32 argmax near-ties (which
would make a k-token verify forward and a 1-token forward disagree in the last bits)
are vanishingly rare.
"""

from __future__ import annotations

import functools
import random

import torch

# tiny models: one thread is fastest, and the CI machine's cores are shared
torch.set_num_threads(1)

VOCAB = 512
EOS = 2

# architecture -> (config class name, kwargs); hidden 32-64, 2-4 layers, vocab 512
ARCHS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2)),
    "mistral": ("MistralConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16)),
    "gemma": ("GemmaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=1, head_dim=16)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=3, n_head=4, n_positions=256)),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                       max_position_embeddings=256)),
    "phi3": ("Phi3Config", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, pad_token_id=0)),
    "opt": ("OPTConfig", dict(hidden_size=64, ffn_dim=128, num_hidden_layers=3, num_attention_heads=4,
                              word_embed_proj_dim=64, max_position_embeddings=256, pad_token_id=1)),
}


def make_config(arch: str, layers: int | None = None, **overrides):
    import transformers

    cls_name, kw = ARCHS[arch]
    kw = dict(kw)
    kw.update(vocab_size=VOCAB, bos_token_id=1, eos_token_id=EOS, initializer_range=0.2, tie_word_embeddings=False)
    if arch not in ("phi3", "opt"):
        kw.setdefault("pad_token_id", 0)
    if layers is not None:
        kw["n_layer" if arch == "gpt2" else "num_hidden_layers"] = layers
    kw.update(overrides)
    cfg = getattr(transformers, cls_name)(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(arch: str, layers: int | None = None, seed: int = 0, **overrides):
    """A tiny fp32 ``AutoModelForCausalLM`` in eval mode, deterministic for (arch, layers, seed)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(arch, layers, **overrides), dtype=torch.float32)
    model.eval()
    # HF generate must not stop early: no eos in its generation config
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@functools.lru_cache(maxsize=None)
def cached_model(arch: str, layers: int | None = None, seed: int = 0):
    return build_model(arch, layers, seed)


class ToyTokenizer:
    """A deterministic tokenizer over ``VOCAB`` ids.

    id 0 = <pad>, 1 = <bos>, 2 = <eos> (special, decoded to "");  other ids decode to a
    letter (``a``..``z``) optionally followed by a second letter or a space, so decoded
    texts are short and stop strings can be tested.  Encoding a string maps each
    character to one id (used only by tests that pass strings).
    """

    eos_token_id = EOS
    bos_token_id = 1
    pad_token_id = 0
    all_special_ids = [0, 1, 2]

    def __init__(self, vocab: int = VOCAB):
        self.vocab = vocab
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.pieces = {}
        for i in range(3, vocab):
            j = i - 3
            first = letters[j % 26]
            second = ["", " ", *letters][(j // 26) % 28]
            self.pieces[i] = first + second
        self.char_ids = {}
        for i, p in self.pieces.items():
            if len(p) == 1:
                self.char_ids.setdefault(p, i)

    def __len__(self) -> int:
        return self.vocab

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for t in ids:
            if t in self.pieces:
                out.append(self.pieces[t])
            elif not skip_special_tokens:
                out.append({0: "<pad>", 1: "<bos>", 2: "<eos>"}.get(t, "<unk>"))
        return "".join(out)

    def __call__(self, text: str, add_special_tokens: bool = True):
        ids = [self.bos_token_id] if add_special_tokens else []
        ids += [self.char_ids.get(c, 3) for c in text]
        return {"input_ids": ids}


def make_prompts(n: int = 8, seed: int = 0, vocab: int = VOCAB) -> list[list[int]]:
    """``n`` prompts of mixed lengths (3..40): random ones and repetitive ones (so n-gram
    lookup drafts and gets accepted)."""
    rng = random.Random(seed)
    lengths = [3, 40, 17, 9, 33, 5, 26, 12, 21, 38, 7, 30]
    prompts = []
    for i in range(n):
        L = lengths[i % len(lengths)]
        if i % 2 == 1 or L < 6:
            prompts.append([rng.randrange(3, vocab) for _ in range(L)])
        else:  # a repeated motif
            motif = [rng.randrange(3, vocab) for _ in range(rng.choice([3, 4, 5]))]
            prompts.append((motif * (L // len(motif) + 1))[:L])
    return prompts


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF ``generate`` at batch 1, greedy, explicit attention mask, eos disabled."""
    ids = torch.tensor([prompt])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )
    new = out[0, len(prompt):].tolist()
    assert len(new) == max_new_tokens, f"HF generate stopped early: {len(new)} < {max_new_tokens}"
    return new


@torch.inference_mode()
def manual_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding with full forwards (no cache): an independent reference."""
    seq = list(prompt)
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(prompt):]


class MaskIgnoringTarget(torch.nn.Module):
    """A causal LM whose forward drops any attention mask it is given, so it cannot take a
    token tree's: what the start-up tree probe must refuse."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config

    def forward(self, input_ids, attention_mask=None, **kw):
        return self.inner(input_ids=input_ids, **kw)

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()
