"""Tiny random targets and heads written in the public layouts, for the mtplayer tests.

Nothing is downloaded.  Every model is a randomly initialised fp32 tiny config with a large
``initializer_range`` (0.2, as the core's tests use) so that argmax near-ties, which would
let a k-token verify and a 1-token forward disagree in the last bits, are vanishingly rare.

* ``tiny_tokenizer()``: a word-level tokenizer with ``VOCAB`` ids (0..3 specials);
* ``build_target(arch)``: a Llama- or Qwen2-style target (hidden 32, 2 layers, vocab 96);
* ``save_target_with_mtp(folder, ...)``: the target saved with ``n`` extra MTP modules in
  the DeepSeek-V3 / GLM layout (``model.layers.{L+i}.*``, optionally without
  ``shared_head.head``), the MiMo layout (``model.mtp_layers.{i}.*``, ``input_proj`` over
  ``[h; e]``) or sharded (``model.safetensors.index.json``); returns the module tensors in
  DeepSeek naming, the reference values;
* ``medusa_tensors(...)`` / ``save_medusa_legacy`` / ``save_medusa_vllm``: Medusa heads in
  FasterDecoding's ``medusa_lm_head.pt`` and vLLM's safetensors naming.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)

VOCAB = 96
WORDS = ("the a of to and in is it that for on with as was at by be this from or have not are but one two three "
         "four five six seven eight nine ten cat dog bird fish red green blue big small def return if else while "
         "print x y z hello world").split()


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<pad>", "<bos>", "<eos>", "<unk>"] + list(dict.fromkeys(WORDS))
    names += [f"w{i}" for i in range(VOCAB - len(names))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>")


def target_config(arch: str = "llama", hidden: int = 32, layers: int = 2):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    return cls(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2, tie_word_embeddings=False,
               bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")


def build_target(arch: str = "llama", seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config(arch, hidden, layers)).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


def mtp_tensors(target, n: int, own_head: bool, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random MTP modules for ``target`` in DeepSeek naming (``model.layers.{L+i}.*``)."""
    from lightspec_mtplayer.modules import MTPLayer

    L = target.config.num_hidden_layers
    out = {}
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        layer = MTPLayer(target, L + i, own_head=own_head)
        for name, value in layer.state_dict().items():
            local = name[len("block."):] if name.startswith("block.") else name
            if value.dim() == 1:  # norms: around 1, not exactly (a swapped norm must show)
                v = 1 + 0.3 * torch.randn(value.shape, generator=g)
            else:
                v = 0.2 * torch.randn(value.shape, generator=g)
            out[f"model.layers.{L + i}.{local}"] = v
    return out


def _to_mimo(tensors: dict[str, torch.Tensor], L: int, H: int) -> dict[str, torch.Tensor]:
    names = {"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj",
             "shared_head.norm": "final_layernorm"}
    out = {}
    for key, value in tensors.items():
        rest = key[len("model.layers."):]
        idx, local = rest.split(".", 1)
        i = int(idx) - L
        for old, new in names.items():
            if local.startswith(old + "."):
                local = new + local[len(old):]
                if new == "input_proj":
                    value = torch.cat([value[:, H:], value[:, :H]], dim=1)  # MiMo reads [h; e]
                break
        out[f"model.mtp_layers.{i}.{local}"] = value
    return out


def save_target_with_mtp(folder, arch: str = "llama", n: int = 1, layout: str = "deepseek", own_head: bool = True,
                         sharded: bool = False, seed: int = 0, embed_copy: bool = False):
    """Save a tiny target plus ``n`` MTP modules into ``folder`` (module docstring).
    Returns ``(target, tokenizer, reference tensors in DeepSeek naming)``."""
    folder = Path(folder)
    target = build_target(arch, seed)
    tok = tiny_tokenizer()
    target.save_pretrained(folder)
    tok.save_pretrained(folder)
    L, H = target.config.num_hidden_layers, target.config.hidden_size
    ref = mtp_tensors(target, n, own_head, seed + 1)
    extra = _to_mimo(ref, L, H) if layout == "mimo" else dict(ref)
    if embed_copy:
        for i in range(n):
            extra[f"model.layers.{L + i}.embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    base = load_file(str(folder / "model.safetensors"))
    if sharded:
        (folder / "model.safetensors").unlink()
        save_file(base, str(folder / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
        save_file(extra, str(folder / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
        weight_map = {k: "model-00001-of-00002.safetensors" for k in base}
        weight_map.update({k: "model-00002-of-00002.safetensors" for k in extra})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        save_file({**base, **extra}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = n
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return target, tok, ref


def medusa_tensors(H: int, V: int, heads: int, layers: int, seed: int = 2, own_heads: bool = True):
    """``(blocks [heads][layers] of (weight [H, H], bias [H]), lm_heads [heads] of [V, H] or None)``."""
    g = torch.Generator().manual_seed(seed)
    blocks = [[(0.3 * torch.randn(H, H, generator=g), 0.1 * torch.randn(H, generator=g)) for _ in range(layers)]
              for _ in range(heads)]
    lm = [0.3 * torch.randn(V, H, generator=g) for _ in range(heads)] if own_heads else None
    return blocks, lm


def save_medusa_legacy(folder, blocks, lm, H: int, V: int, prefix: str = "", container: str = "pt") -> Path:
    """FasterDecoding's ``medusa_lm_head.pt`` (``container="safetensors"``: the
    ``medusa_lm_head.safetensors`` its training script and TGI write): ``{i}.{j}.linear.weight/bias``,
    ``{i}.{L}.weight``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for i, head in enumerate(blocks):
        for j, (w, b) in enumerate(head):
            state[f"{prefix}{i}.{j}.linear.weight"], state[f"{prefix}{i}.{j}.linear.bias"] = w, b
        state[f"{prefix}{i}.{len(head)}.weight"] = lm[i]
    if container == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, str(folder / "medusa_lm_head.pt"))
    cfg = {"medusa_num_heads": len(blocks), "medusa_num_layers": len(blocks[0]), "base_model_name_or_path": "tiny"}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def save_medusa_vllm(folder, blocks, lm, H: int, V: int, bias: bool = True, shared: bool = False) -> Path:
    """vLLM's naming: ``blocks.{i}.layers.{j}.weight/bias``, ``lm_heads.{i}.weight`` (safetensors)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for i, head in enumerate(blocks):
        for j, (w, b) in enumerate(head):
            state[f"blocks.{i}.layers.{j}.weight"] = w.contiguous()
            if bias:
                state[f"blocks.{i}.layers.{j}.bias"] = b.contiguous()
        if not shared:
            state[f"lm_heads.{i}.weight"] = lm[i].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    cfg = {"model_type": "medusa", "num_heads": len(blocks), "num_hidden_layers": len(blocks[0]), "hidden_size": H,
           "vocab_size": V, "medusa_fc_bias": bias}
    if shared:
        cfg["lightspec_shared_lm_head"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@torch.inference_mode()
def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()
