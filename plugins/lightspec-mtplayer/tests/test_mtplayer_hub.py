"""Targets and heads named by hub id (``org/name``), read from the Hugging Face cache (offline
here): ``mtp`` finds the MTP modules in a hub target's own checkpoint (as for MiMo, DeepSeek or
GLM loaded by id), and ``head=org/name`` loads Medusa heads in both public layouts."""

import pytest
import torch
from fixtures import VOCAB, medusa_tensors, save_medusa_legacy, save_medusa_vllm, save_target_with_mtp, tiny_tokenizer
from helpers import offline_hub_cache, put_in_hub_cache
from transformers import AutoModelForCausalLM

from lightspec_core import LightSpecError, MTPPipeline

PROMPTS = [[5, 9, 13, 5, 9], [7, 8], [20, 21, 22, 23, 24, 25, 26]]
STATIC = {"type": "static", "k": 3}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    return offline_hub_cache(tmp_path, monkeypatch)


def run(pipe):
    outs = pipe.generate(PROMPTS, max_new_tokens=10, ignore_eos=True)
    return [o.token_ids for o in outs], sum(o.stats.drafted for o in outs)


@pytest.mark.parametrize("sharded", [False, True])
def test_auto_reads_the_mtp_modules_of_a_target_loaded_by_hub_id(hub, tmp_path, sharded):
    src = tmp_path / "src"
    save_target_with_mtp(src, "llama", n=1, sharded=sharded)
    put_in_hub_cache(hub, "org/mtp-target", src)
    local, drafted = run(MTPPipeline.from_pretrained(str(src), strategy="mtp", budget=STATIC, dtype="float32"))
    by_id = MTPPipeline.from_pretrained("org/mtp-target", strategy="mtp", budget=STATIC, dtype="float32")
    assert by_id.target.name_or_path == "org/mtp-target"
    out, drafted_id = run(by_id)
    plain, _ = run(MTPPipeline.from_pretrained(str(src), strategy="none", dtype="float32"))
    assert out == local == plain and drafted > 0 and drafted_id == drafted


@pytest.mark.parametrize("layout", ["legacy", "vllm"])
def test_medusa_heads_named_by_hub_id_draft_as_their_folder_does(hub, tmp_path, layout):
    src = tmp_path / "target"
    save_target_with_mtp(src, "llama", n=1)
    target = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    blocks, lm = medusa_tensors(32, VOCAB, heads=3, layers=1)
    save = save_medusa_legacy if layout == "legacy" else save_medusa_vllm
    heads = save(tmp_path / "medusa", blocks, lm, 32, VOCAB)
    put_in_hub_cache(hub, "org/medusa-heads", heads)
    tok = tiny_tokenizer()
    local, drafted = run(MTPPipeline(target, tok, strategy="mtp", head=str(heads), budget=STATIC))
    by_id, drafted_id = run(MTPPipeline(target, tok, strategy="mtp", head="org/medusa-heads", budget=STATIC))
    plain, _ = run(MTPPipeline(target, tok, strategy="none"))
    assert by_id == local == plain and drafted > 0 and drafted_id == drafted


def test_an_uncached_head_id_is_one_line_saying_how_to_get_it(hub, tmp_path):
    src = tmp_path / "target"
    save_target_with_mtp(src, "llama", n=1)
    target = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with pytest.raises(LightSpecError) as err:
        MTPPipeline(target, tiny_tokenizer(), strategy="mtp", head="org/not-here")
    msg = str(err.value)
    assert "MTP/Medusa head 'org/not-here' is not (fully) in the Hugging Face cache" in msg
    assert "`hf download org/not-here`" in msg and "\n" not in msg
