"""Loading models as the Hugging Face ecosystem does (local folders, hub ids through the
HF cache, offline mode), one clear error per bad model, and passed model objects left as
they are.  Nothing here reaches the network: every test runs with ``HF_HUB_OFFLINE=1``
(``conftest.py``, and the ``hub_cache`` fixture for the cache it builds)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import TINY_VOCAB, offline_hub_cache, put_in_hub_cache, save_tiny, tiny_model, tiny_tokenizer
from lightspec_core.cli import cli, main
from lightspec_core.errors import LightSpecError
from lightspec_core.loading import check_causal_lm, has_cpu_kernels
from lightspec_core.pipeline import MTPPipeline

PROMPT = "the cat the cat the cat one two"


def cache_repo(cache: Path, repo: str, arch: str = "llama", seed: int = 0) -> Path:
    """Put a tiny model into ``cache`` as ``hf download`` lays it out; returns its source folder."""
    src = save_tiny(cache.parent / f"src-{repo.replace('/', '--')}", arch=arch, seed=seed)
    put_in_hub_cache(cache, repo, src)
    return src


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    return offline_hub_cache(tmp_path, monkeypatch)


def greedy(pipe, n=6):
    return pipe.generate(PROMPT, max_new_tokens=n, ignore_eos=True).token_ids


# -- 1. names resolved as transformers resolves them ------------------------------------------


def test_a_local_folder_loads(tmp_path):
    folder = save_tiny(tmp_path / "m")
    pipe = MTPPipeline.from_pretrained(str(folder), strategy="ngram")
    assert pipe.target.name_or_path == str(folder)
    assert len(greedy(pipe)) == 6


def test_a_hub_id_loads_from_the_cache_offline(hub_cache, tmp_path):
    """``org/name`` (target and draft) from a cache laid out like ``hf download``'s,
    with HF_HUB_OFFLINE=1: the same model as its local folder, token for token."""
    src = cache_repo(hub_cache, "org/name")
    cache_repo(hub_cache, "org/draft", seed=1)
    pipe = MTPPipeline.from_pretrained("org/name", strategy="draft_model", draft_model="org/draft")
    assert pipe.target.name_or_path == "org/name"
    assert pipe.strategy.model.name_or_path == "org/draft"
    local = MTPPipeline.from_pretrained(str(src), strategy="none")
    assert greedy(pipe) == greedy(local)


def test_cli_run_takes_a_hub_id(hub_cache):
    cache_repo(hub_cache, "org/name")
    res = CliRunner().invoke(cli, ["run", "--model", "org/name", "--strategy", "ngram", "--prompt", PROMPT,
                                   "--max-new-tokens", "4", "--json"], obj={})
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["prompt"] == PROMPT and len(row["token_ids"]) in range(1, 5)


def test_a_hub_id_resolves_through_hf_home_in_a_fresh_process(tmp_path):
    """The environment variables as a user sets them, read by huggingface_hub at import:
    HF_HOME (the cache in HF_HOME/hub) and HF_HUB_OFFLINE=1."""
    home = tmp_path / "home"
    cache_repo(home / "hub", "org/name")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "lightspec_core.cli", "run", "--model", "org/name", "--strategy",
                           "ngram", "--prompt", PROMPT, "--max-new-tokens", "3", "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)[0]["token_ids"]) in range(1, 4)


def test_an_id_missing_from_the_cache_offline_is_one_line_naming_it(hub_cache, capsys):
    with pytest.raises(LightSpecError) as err:
        MTPPipeline.from_pretrained("org/missing", strategy="ngram")
    msg = str(err.value)
    assert "'org/missing'" in msg and "`hf download org/missing`" in msg and "HF_HUB_OFFLINE=1" in msg
    assert str(hub_cache) in msg and "\n" not in msg
    rc = main(["run", "--model", "org/missing", "--prompt", "a"])
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == 2 and err_lines == [f"error: {msg}"]


def test_an_uncached_draft_model_id_is_reported_too(hub_cache):
    cache_repo(hub_cache, "org/name")
    with pytest.raises(LightSpecError, match="model 'org/nodraft' is not .fully. in the Hugging Face cache"):
        MTPPipeline.from_pretrained("org/name", strategy="draft_model", draft_model="org/nodraft")


def test_progress_names_the_model_and_shows_transformers_bars_only_when_asked(hub_cache, capfd):
    cache_repo(hub_cache, "org/name")
    capfd.readouterr()
    MTPPipeline.from_pretrained("org/name", strategy="none", progress=True)
    shown = capfd.readouterr().err
    assert "loading org/name from the Hugging Face cache" in shown and "Loading weights" in shown
    MTPPipeline.from_pretrained("org/name", strategy="none")
    assert capfd.readouterr().err == ""


# -- 2. one clear line per model that cannot be loaded ------------------------------------


def _empty(folder):
    folder.mkdir()


def _truncated(folder):
    save_tiny(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _no_tokenizer(folder):
    save_tiny(folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).unlink()


def _no_weights(folder):
    save_tiny(folder)
    (folder / "model.safetensors").unlink()


def _missing_weights(folder):
    """A checkpoint without some of its config's weights (transformers would fill them at random)."""
    from safetensors.torch import load_file, save_file

    save_tiny(folder)
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if ".layers.1." not in k}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def _eagle3_head(folder):
    """An EAGLE-3 head (one layer under ``midlayer.``, ``fc``) passed as a model."""
    from safetensors.torch import load_file, save_file

    save_tiny(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    state = load_file(str(folder / "model.safetensors"))
    head = {k.replace("model.layers.0.", "midlayer."): v for k, v in state.items() if ".layers.0." in k}
    save_file({**head, "fc.weight": torch.zeros(64, 192)}, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _t5(folder):
    import transformers

    cfg = transformers.T5Config(vocab_size=TINY_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
    transformers.T5ForConditionalGeneration(cfg).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)


def _bert_config(**kw):
    import transformers

    return transformers.BertConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, **kw)


def _bert_masked_lm(folder):
    import transformers

    transformers.BertForMaskedLM(_bert_config()).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)


def _bert_lm_head_not_decoder(folder):
    import transformers

    transformers.BertLMHeadModel(_bert_config()).save_pretrained(folder)  # is_decoder left false
    tiny_tokenizer().save_pretrained(folder)


def _small_vocab(folder):
    tiny_model(vocab=64).save_pretrained(folder)
    tiny_tokenizer(TINY_VOCAB).save_pretrained(folder)


BAD_MODELS = {
    "empty folder": (_empty, ["model folder", "is empty", "config.json"]),
    "truncated weights": (_truncated, ["weights file model.safetensors is unreadable", "truncated or corrupt"]),
    "no tokenizer files": (_no_tokenizer, ["has no tokenizer files", "tokenizer.json", "tokenizer="]),
    "no weights": (_no_weights, ["has a config.json but no weights", "model.safetensors"]),
    "t5": (_t5, ["(t5, T5Config) is an encoder-decoder model, not a causal LM", "AutoModelForCausalLM", "Llama"]),
    "bert masked lm": (_bert_masked_lm, ["(bert, BertConfig) was saved as BertForMaskedLM, not a causal LM",
                                         "*ForCausalLM"]),
    "bert without is_decoder": (_bert_lm_head_not_decoder, ["is an encoder with is_decoder=false",
                                                            "not a causal LM"]),
    "missing weights": (_missing_weights, ["lacks 9 of the weights its config needs (model.layers.1.",
                                           "random values: save or download the model again"]),
    "an EAGLE-3 head": (_eagle3_head, ["lacks", "it is an EAGLE-3 head: use --strategy eagle3"]),
    "vocabulary below the tokenizer": (_small_vocab, ["vocabulary of 64 tokens (lm_head rows)", "tokenizer has 96"]),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_a_bad_model_is_one_line_and_exit_2(case, tmp_path, capsys):
    build, needles = BAD_MODELS[case]
    folder = tmp_path / "bad"
    build(folder)
    with pytest.raises(LightSpecError) as err:
        MTPPipeline.from_pretrained(str(folder), strategy="ngram")
    msg = str(err.value)
    assert str(folder) in msg and "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    capsys.readouterr()
    rc = main(["run", "--model", str(folder), "--prompt", "the cat"])
    err_text = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err_text
    assert [line for line in err_text.splitlines() if line.startswith("error:")] == [f"error: {msg}"]


def test_a_file_or_a_missing_path_is_not_a_model(tmp_path):
    folder = save_tiny(tmp_path / "m")
    with pytest.raises(LightSpecError, match="model '.*model.safetensors' is a file: give the folder"):
        MTPPipeline.from_pretrained(str(folder / "model.safetensors"))
    with pytest.raises(LightSpecError, match="model '/no/such/dir' not found: no such folder, and not a hub id"):
        MTPPipeline.from_pretrained("/no/such/dir")


def test_a_bert_decoder_is_accepted_as_a_causal_lm():
    """The refusal is aimed: BERT's LM head with is_decoder=true is a causal LM."""
    check_causal_lm(_bert_config(is_decoder=True, architectures=["BertLMHeadModel"]), "bert-decoder")


# -- 3. passed models are left as they are ------------------------------------------------


def snapshot(model):
    return {
        "state": {k: (v.detach().clone(), v.dtype, v.stride()) for k, v in model.state_dict().items()},
        "types": [(n, type(m)) for n, m in model.named_modules()],
        "training": [m.training for m in model.modules()],
        "attention": model.config._attn_implementation,
    }


def assert_unchanged(model, before):
    after = snapshot(model)
    assert after["types"] == before["types"] and after["training"] == before["training"]
    assert after["attention"] == before["attention"]
    assert after["state"].keys() == before["state"].keys()
    for k, (v, dtype, stride) in before["state"].items():
        w, wdtype, wstride = after["state"][k]
        assert wdtype == dtype and wstride == stride and torch.equal(w, v), k


def test_a_passed_model_and_draft_are_not_changed():
    model, draft, tok = tiny_model(), tiny_model(seed=1), tiny_tokenizer()
    before, draft_before = snapshot(model), snapshot(draft)
    for strategy in ("draft_model", "ngram", "layerskip"):
        greedy(MTPPipeline.from_pretrained(model, tokenizer=tok, strategy=strategy, draft_model=draft))
        greedy(MTPPipeline(model, tok, strategy=strategy, draft_model=draft, device="cpu", dtype="float32"))
    assert_unchanged(model, before)
    assert_unchanged(draft, draft_before)
    assert not has_cpu_kernels(model) and not has_cpu_kernels(draft)


def test_cpu_kernels_true_installs_them_into_passed_models():
    model, draft, tok = tiny_model(), tiny_model(seed=1), tiny_tokenizer()
    reference = greedy(MTPPipeline(tiny_model(), tok, strategy="none"))
    pipe = MTPPipeline(model, tok, strategy="draft_model", draft_model=draft, cpu_kernels=True)
    assert has_cpu_kernels(model) and has_cpu_kernels(draft)
    assert not any(m.training for m in model.modules())  # the kernels' new modules are in eval mode too
    assert greedy(pipe) == reference  # the same tokens, through the kernels


def assert_has_kernels(model):
    from lightspec_core.cpu_norm import KernelRMSNorm
    from lightspec_core.hf_attention import uses_cpu_attention
    from lightspec_core.weight_layout import PackedLinear, is_column_major
    from lightspec_kernels import cpu_attention, cpu_linear, cpu_norm_rope

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if cpu_linear.available():
        assert all(isinstance(m, PackedLinear) for m in linears)
    else:
        assert all(is_column_major(m.weight) for m in linears)
    assert any(isinstance(m, KernelRMSNorm) for m in model.modules()) == cpu_norm_rope.available()
    assert uses_cpu_attention(model) == cpu_attention.available()


def test_models_the_pipeline_loads_get_the_cpu_kernels_unless_told_not_to(tmp_path):
    target, draft = save_tiny(tmp_path / "t"), save_tiny(tmp_path / "d", seed=1)
    pipe = MTPPipeline.from_pretrained(str(target), strategy="draft_model", draft_model=str(draft), device="cpu",
                                       dtype="float32")
    assert_has_kernels(pipe.target)
    assert_has_kernels(pipe.strategy.model)
    assert not any(m.training for m in pipe.target.modules())
    plain = MTPPipeline.from_pretrained(str(target), strategy="draft_model", draft_model=str(draft), device="cpu",
                                        dtype="float32", cpu_kernels=False)
    assert not has_cpu_kernels(plain.target) and not has_cpu_kernels(plain.strategy.model)
    assert greedy(pipe) == greedy(plain)


def test_a_passed_model_elsewhere_than_asked_is_an_error_not_a_move():
    model, tok = tiny_model(), tiny_tokenizer()
    with pytest.raises(LightSpecError, match=r"is float32, but dtype='bfloat16' was asked: convert it first"):
        MTPPipeline.from_pretrained(model, tokenizer=tok, strategy="none", dtype="bfloat16")
    with pytest.raises(LightSpecError, match=r"is on cpu, but device='meta' was asked: move it first"):
        MTPPipeline(model, tok, strategy="none", device="meta")
    assert next(model.parameters()).dtype == torch.float32
    half = tiny_model().to(torch.bfloat16)  # unset device/dtype: taken as it is
    pipe = MTPPipeline(half, tok, strategy="none")
    assert pipe.dtype == torch.bfloat16 and pipe.device == torch.device("cpu")


def test_a_passed_model_in_training_mode_is_refused_and_left_so():
    model, draft, tok = tiny_model(), tiny_model(seed=1), tiny_tokenizer()
    model.train()
    with pytest.raises(LightSpecError, match=r"the model passed \(LlamaForCausalLM\) is in training mode .* model.eval\(\)"):
        MTPPipeline(model, tok, strategy="none")
    assert model.training
    model.eval()
    draft.model.layers[0].train()  # one module is enough
    with pytest.raises(LightSpecError, match=r"the draft model passed .* training mode \(module model.layers.0"):
        MTPPipeline(model, tok, strategy="draft_model", draft_model=draft)


def test_cpu_kernels_takes_none_true_or_false():
    model, tok = tiny_model(), tiny_tokenizer()
    with pytest.raises(LightSpecError, match=r"cpu_kernels='yes' is invalid: use None \(auto\), True or False"):
        MTPPipeline(model, tok, strategy="none", cpu_kernels="yes")
    with pytest.raises(LightSpecError, match="cpu_kernels=True needs a float32 model on the CPU; this one is bfloat16"):
        MTPPipeline(tiny_model().to(torch.bfloat16), tok, strategy="none", cpu_kernels=True)
