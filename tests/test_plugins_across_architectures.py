"""The learned drafters on targets of several families, as a user meets them: each trainer runs
(``lightspec eagle3 train``, ``dspark train``, ``mtplayer train --kind medusa`` and ``--kind
mtp``) for a tiny target of the family, and each strategy over the trained head keeps greedy
output identical to HF at batch 1 and 3, drafting.  Llama targets are the plugins' own tests';
these are the families whose configs and blocks differ from Llama's (GPT-2 and OPT have no
rotary positions: MTP modules are refused there with one error, tested in the mtplayer plugin).
The heads train for 3 steps only: acceptance is not the point, losslessness and running are."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import WORDS, hf_reference, run_cli, save_tiny

from lightspec_core import MTPPipeline

ARCHS = ["qwen3", "gemma", "gpt_neox", "phi3", "gpt2", "opt"]
ROTARY = {"qwen3", "gemma", "gpt_neox", "phi3"}
PROMPTS = ["the cat the cat one two three", "def x ( ) : return x + 1", "a b"]


def train_heads(folder, tmp_path, arch, capsys) -> dict[str, dict]:
    data = tmp_path / "data.txt"
    rng = np.random.default_rng(0)
    data.write_text("\n".join(" ".join(WORDS[int(i)] for i in rng.integers(0, 40, 30)) for _ in range(200)))
    runs = {
        "eagle3": ["eagle3", "train", "--out", str(tmp_path / "e3"), "--seq-len", "32", "--batch", "2",
                   "--max-steps", "3", "--ttt-steps", "2"],
        "dspark": ["dspark", "train", "--out", str(tmp_path / "ds"), "--prompt-len", "16", "--gen-len", "16",
                   "--sequences", "8", "--batch-size", "4", "--anchors", "2", "--steps", "3", "--heads", "2",
                   "--kv-heads", "1", "--head-dim", "16", "--save-dtype", "float32"],
        "medusa": ["mtplayer", "train", "--kind", "medusa", "--out", str(tmp_path / "md"), "--seq-len", "32",
                   "--batch", "2", "--max-steps", "3", "--save-dtype", "float32"],
    }
    if arch in ROTARY:
        runs["mtp_modules"] = ["mtplayer", "train", "--kind", "mtp", "--out", str(tmp_path / "mm"), "--seq-len", "32",
                               "--batch", "2", "--max-steps", "3", "--save-dtype", "float32"]
    for name, args in runs.items():
        rc, out, err = run_cli([*args, "--target", str(folder), "--data", str(data)], capsys)
        assert rc == 0, (name, err[-2000:])
    strategies = {
        "eagle3": {"type": "eagle3", "head": str(tmp_path / "e3")},
        "eagle3_tree": {"type": "eagle3_tree", "drafter_options": {"head": str(tmp_path / "e3")}},
        "dspark": {"type": "dspark", "checkpoint": str(tmp_path / "ds")},
        "mtp (Medusa)": {"type": "mtp", "head": str(tmp_path / "md")},
    }
    if arch in ROTARY:
        strategies["mtp (MTP modules)"] = {"type": "mtp", "head": str(tmp_path / "mm")}
    return strategies


@pytest.mark.parametrize("arch", ARCHS)
def test_trained_heads_of_every_plugin_are_lossless_on_the_family(arch, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = save_tiny(tmp_path / "target", arch=arch)
    strategies = train_heads(folder, tmp_path, arch, capsys)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    refs = [hf_reference(model, tok, p, 10) for p in PROMPTS]
    for name, strategy in strategies.items():
        pipe = MTPPipeline(model, tok, strategy=strategy, budget={"type": "static", "k": 3})
        one = pipe.generate(PROMPTS[0], max_new_tokens=10, ignore_eos=True)
        outs = pipe.generate(PROMPTS, max_new_tokens=10, ignore_eos=True)
        assert one.token_ids == refs[0], name
        assert [o.token_ids for o in outs] == refs, name
        assert sum(o.stats.drafted for o in outs) > 0 and not any(o.stats.failures for o in outs), name
