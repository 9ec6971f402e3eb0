"""Bad input gets one clear error naming the value and what is allowed (issue 25): through
the API an ``InvalidTypeError`` / ``InvalidValueError`` (``TypeError`` / ``ValueError``
and ``LightSpecError``), through the CLI one ``error:`` line and exit code 2.  (Over 400 lines: one test per case of the
issue's list, in its order, so the file reads as that list.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from helpers import TINY_VOCAB, cached_tiny, save_tiny, tiny_model, tiny_tokenizer
from lightspec_core.cli import main, read_prompts
from lightspec_core.config import load_defaults
from lightspec_core.limits import context_length
from lightspec_core.sampling import MIN_TEMPERATURE, SamplingParams

from lightspec_core import ConfigError, InvalidTypeError, InvalidValueError, LightSpecError, MTPPipeline


@pytest.fixture(scope="module")
def pipe():
    model, tok = cached_tiny()
    return MTPPipeline(model, tok, strategy="none")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("errors_model")))


def cli(args, cwd=None, monkeypatch=None):
    """``lightspec ARGS`` through ``cli.main`` under click's CliRunner isolation:
    (exit code, stdout, stderr)."""
    if cwd is not None:
        monkeypatch.chdir(cwd)
    with CliRunner().isolation() as (out, err, _):
        rc = main(list(args))
    return rc, out.getvalue().decode(), err.getvalue().decode()


def one_error_line(rc, err, needle):
    assert rc == 2, err
    assert "Traceback" not in err and "Usage:" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("loading", "Loading"))]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


# -- 0. the exception classes --------------------------------------------------------------


def test_error_classes_are_builtin_errors_and_lightspec_errors():
    assert issubclass(InvalidValueError, ValueError) and issubclass(InvalidValueError, LightSpecError)
    assert issubclass(InvalidTypeError, TypeError) and issubclass(InvalidTypeError, LightSpecError)
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, LightSpecError)


def test_error_classes_import_without_torch():
    code = ("import sys; from lightspec_core import InvalidTypeError, InvalidValueError, ConfigError; "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# -- 1. prompt encodings ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["prompts.txt", "prompts.jsonl"])
def test_prompts_file_with_non_utf8_bytes_names_file_and_line(tmp_path, name):
    path = tmp_path / name
    good = b'{"prompt": "fine"}\n' if name.endswith(".jsonl") else b"fine\n"
    path.write_bytes(good + good + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(InvalidValueError) as info:
        read_prompts((), str(path))
    assert str(info.value).startswith(f"{path}:3: not valid UTF-8 (byte 0xe9 at byte 16 of the line)")


def test_prompt_argument_not_utf8_is_refused():
    with pytest.raises(InvalidValueError, match=r"--prompt 'a\\udcffb' is not valid UTF-8 text \(byte 0xff at character 2\)"):
        read_prompts(("fine", "a\udcffb"), None)


def test_prompt_argument_not_utf8_from_a_real_command_line(tmp_path, model_dir):
    """On Linux the bytes of argv reach Python as surrogate escapes: a subprocess gets
    exit code 2 and one stderr line, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "lightspec_core.cli", "run", "--model", model_dir,
                           "--prompt", b"caf\xe9"], capture_output=True, cwd=tmp_path)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == [
        "error: --prompt 'caf\\udce9' is not valid UTF-8 text (byte 0xe9 at character 4): pass UTF-8 text "
        "(check the terminal's encoding)"
    ]


@pytest.mark.parametrize("name,body", [
    ("prompts.jsonl", '{"prompt": "one two"}\n{"turns": ["three", "x"]}\n'),
    ("prompts.txt", "one two\nthree\n"),
])
def test_prompts_file_with_bom(tmp_path, name, body):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert read_prompts((), str(path)) == ["one two", "three"]


def test_prompts_file_crlf_and_line_separator_inside_a_json_string(tmp_path):
    """Lines end at "\\n" only: JSON strings may hold a raw U+2028 (``json.dumps(...,
    ensure_ascii=False)`` writes one), which ``str.splitlines`` would split on."""
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\r\n" + '{"prompt": "c"}\r\n',
                    encoding="utf-8", newline="")
    assert read_prompts((), str(path)) == ["a\u2028b", "c"]
    text = tmp_path / "p.txt"
    text.write_bytes(b"one\r\ntwo\r\n")
    assert read_prompts((), str(text)) == ["one", "two"]


def test_prompts_file_turns_must_be_strings(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"turns": [{"role": "user"}]}\n')
    with pytest.raises(InvalidValueError, match=r"p.jsonl:1: expected an object with a string 'prompt'"):
        read_prompts((), str(path))


# -- 2. token ids outside the vocabulary ---------------------------------------------------


@pytest.mark.parametrize("bad", [99999, TINY_VOCAB, -1])
def test_token_id_outside_the_vocab_is_refused(pipe, bad):
    with pytest.raises(InvalidValueError) as info:
        pipe.generate([[5, 6], [1, 2, bad]], max_new_tokens=2)
    assert str(info.value) == (f"prompt 1 has token id {bad} at position 2, outside this model's vocabulary: "
                               f"allowed ids are [0, {TINY_VOCAB})")


def test_tokenizer_ids_outside_the_model_vocab_are_refused():
    """A tokenizer with more ids than the model's lm_head has rows: refused when the
    pipeline is built, naming both sizes."""
    model, tok = tiny_model(vocab=64), tiny_tokenizer(TINY_VOCAB)
    with pytest.raises(InvalidValueError, match=r"vocabulary of 64 tokens .* its tokenizer has 96"):
        MTPPipeline(model, tok, strategy="none")


# -- 3. prompts of the wrong type ----------------------------------------------------------


@pytest.mark.parametrize("bad", [None, 5, b"abc"])
def test_prompt_none_int_or_bytes_is_refused(pipe, bad):
    with pytest.raises(InvalidTypeError) as info:
        pipe.generate(bad)
    msg = str(info.value)
    assert msg.startswith(f"prompts={bad!r} ({type(bad).__name__}) is invalid: use a str, a list of str") and \
        isinstance(info.value, TypeError)
    with pytest.raises(InvalidTypeError) as info:
        pipe.generate(["fine", bad])
    assert str(info.value).startswith(f"prompt 1 is {bad!r} ({type(bad).__name__}): use a str or a list of int token ids")


def test_prompt_none_is_refused(pipe):
    with pytest.raises(TypeError, match=r"prompt 0 is None \(NoneType\): use a str or a list of int token ids"):
        pipe.generate([None], max_new_tokens=2)


def test_prompt_with_a_non_int_token_is_refused(pipe):
    with pytest.raises(InvalidTypeError, match=r"prompt 0 has 'a' \(str\) at position 1: token ids must be ints"):
        pipe.generate([[5, "a"]])
    with pytest.raises(InvalidTypeError, match=r"prompt 0 has True \(bool\) at position 0"):
        pipe.generate([[True, 5]])


def test_flat_token_list_and_tokenizer_output_get_a_hint(pipe):
    with pytest.raises(InvalidTypeError, match=r"prompt 0 is 5 \(int\): .*put the token ids of one prompt in a list"):
        pipe.generate([5, 6, 7])
    with pytest.raises(InvalidTypeError, match=r"prompts is a BatchEncoding \(a mapping\)"):
        pipe.generate(pipe.tokenizer("the cat"))


def test_token_ids_as_tuples_and_numpy_ints_are_accepted(pipe):
    import numpy as np

    a = pipe.generate([(5, 6, 7)], max_new_tokens=3, ignore_eos=True)[0].token_ids
    b = pipe.generate([list(np.array([5, 6, 7]))], max_new_tokens=np.int64(3), ignore_eos=True)[0].token_ids
    assert a == b and len(a) == 3


# -- 4. sampling, stop and length arguments ------------------------------------------------


def test_temperature_none_is_refused(pipe):
    with pytest.raises(InvalidTypeError, match=r"temperature=None \(NoneType\) is invalid: use a finite number >= 0"):
        pipe.generate("the cat", temperature=None)


@pytest.mark.parametrize("kwargs,error,needle", [
    (dict(top_p=None), InvalidTypeError, "top_p=None (NoneType) is invalid: use a number in (0, 1]"),
    (dict(top_k=2.5), InvalidTypeError, "top_k=2.5 (float) is invalid"),
    (dict(min_p="0.1"), InvalidTypeError, "min_p='0.1' (str) is invalid"),
    (dict(temperature=True), InvalidTypeError, "temperature=True (bool) is invalid"),
    (dict(seed="x"), InvalidTypeError, "seed='x' (str) is invalid: use an integer or None"),
    (dict(seed=2**64), InvalidValueError, "seed=18446744073709551616 is invalid: use an integer in [-2**63, 2**64)"),
    (dict(temperature=float("inf")), InvalidValueError, "temperature=inf is invalid"),
])
def test_sampling_params_name_value_and_allowed(kwargs, error, needle):
    with pytest.raises(error) as info:
        SamplingParams(**kwargs)
    assert needle in str(info.value)


def test_sampling_params_store_plain_numbers():
    import numpy as np

    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), top_p=1, seed=np.int64(7))
    assert (type(p.temperature), type(p.top_k), type(p.top_p), type(p.seed)) == (float, int, float, int)


@pytest.mark.parametrize("stop,error,needle", [
    (5, InvalidTypeError, "stop=5 (int) is invalid: use a non-empty string or a list of them"),
    ([None], InvalidTypeError, "stop[0]=None (NoneType) is invalid"),
    ("", InvalidValueError, "stop='' is invalid: an empty stop string would stop every row at once"),
    (["x", ""], InvalidValueError, "stop[1]='' is invalid"),
])
def test_stop_int_none_or_empty_is_refused(pipe, stop, error, needle):
    with pytest.raises(error) as info:
        pipe.generate("the cat", max_new_tokens=4, stop=stop)
    assert needle in str(info.value)


def test_max_new_tokens_above_the_context_is_refused(pipe):
    with pytest.raises(InvalidValueError, match=r"max_new_tokens=1000000000 is invalid: use an integer in 1\.\.2048 "
                                                r"\(this model's context length\)"):
        pipe.generate("the cat", max_new_tokens=10**9)
    with pytest.raises(InvalidTypeError, match=r"max_new_tokens=True \(bool\) is invalid"):
        pipe.generate("the cat", max_new_tokens=True)
    pipe.generate("the cat", max_new_tokens=2)  # the context length itself is allowed; small values run


def test_max_new_tokens_with_unknown_context_keeps_the_old_check():
    from lightspec_core.arguments import check_max_new_tokens

    assert check_max_new_tokens(10**9, None) == 10**9
    with pytest.raises(InvalidValueError, match=r"max_new_tokens=0 is invalid: use an integer >= 1$"):
        check_max_new_tokens(0, None)


def test_prompt_longer_than_the_context_is_refused_before_any_work():
    from models import build_model

    model = build_model("llama", layers=1, vocab_size=TINY_VOCAB, max_position_embeddings=16)
    p = MTPPipeline(model, tiny_tokenizer(), strategy="none")
    calls, run = [], p.engine.run

    def counting_run(*args, **kwargs):
        calls.append(1)
        return run(*args, **kwargs)

    p.engine.run = counting_run
    with pytest.raises(InvalidValueError, match=r"^prompt 1 has 17 tokens; this model's context is 16"):
        p.generate([[5] * 3, [5] * 17], max_new_tokens=2)
    assert calls == []
    assert len(p.generate([[5] * 16], max_new_tokens=1)[0].token_ids) == 1 and calls == [1]


def test_context_length_reads_the_config_keys():
    from transformers import GPT2Config, LlamaConfig, PretrainedConfig

    assert context_length(LlamaConfig(max_position_embeddings=4096)) == 4096
    assert context_length(GPT2Config(n_positions=333)) == 333
    assert context_length(cached_tiny()[0]) == 2048  # a model: its .config
    assert context_length(PretrainedConfig()) is None
    cfg = PretrainedConfig()
    cfg.seq_length = 8192
    assert context_length(cfg) == 8192
    cfg.max_position_embeddings = None  # unset keys are skipped
    assert context_length(cfg) == 8192


# -- 5. temperatures whose logits overflow -------------------------------------------------


def test_temperature_underflow_is_refused_as_hf_fails(pipe):
    """HF ``generate`` divides float32 logits by 1e-39 (``TemperatureLogitsWarper``) and
    its sampler fails on the resulting inf/NaN probabilities; LightSpec (which sampled the
    last token over and over here) refuses such a temperature up front, and the smallest
    allowed one gives the greedy output."""
    model, _ = cached_tiny()
    x = torch.tensor([[5, 6, 7]])
    with pytest.raises(RuntimeError, match="inf"):
        model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1e-39, top_k=0,
                       max_new_tokens=3, eos_token_id=None, pad_token_id=0)
    for t in (1e-39, 1e-45, MIN_TEMPERATURE / 2):
        with pytest.raises(InvalidValueError, match=rf"temperature={t!r} is too small: .*use 0 for greedy decoding"):
            pipe.generate([[5, 6, 7]], temperature=t, seed=0)
    greedy = pipe.generate([[5, 6, 7]], max_new_tokens=6, ignore_eos=True)[0].token_ids
    tiny = pipe.generate([[5, 6, 7]], max_new_tokens=6, ignore_eos=True, temperature=MIN_TEMPERATURE, seed=0)
    assert tiny[0].token_ids == greedy


def test_temperature_underflow_on_the_cli(monkeypatch, tmp_path, model_dir):
    rc, _, err = cli(["run", "--model", model_dir, "--prompt", "the", "--temperature", "1e-39"], tmp_path, monkeypatch)
    one_error_line(rc, err, "temperature=1e-39 is too small")


# -- 6. strategies -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [123, None, ["ngram"]])
def test_strategy_int_is_refused(bad):
    """(A mapping ``{"type": "ngram"}`` is a strategy spec: tests/test_strategy_specs.py.)"""
    model, tok = cached_tiny()
    with pytest.raises(InvalidTypeError) as info:
        MTPPipeline(model, tok, strategy=bad)
    msg = str(info.value)
    assert msg.startswith(f"strategy={bad!r} ({type(bad).__name__}) is invalid: use a registered strategy name (")
    assert "ngram" in msg and ("a YAML file path, a mapping {'type': name, **options}, or a strategy object with "
                               "lightspec_propose") in msg


def test_strategy_objects_with_propose_are_accepted():
    from lightspec_core.strategies.plain import PlainDecoding

    class Nothing:
        name = "nothing"

        def lightspec_propose(self, ctx):
            return None

    model, tok = cached_tiny()
    for strategy in (Nothing(), PlainDecoding()):
        out = MTPPipeline(model, tok, strategy=strategy).generate([[5, 6]], max_new_tokens=2, ignore_eos=True)
        assert len(out[0].token_ids) == 2


@pytest.mark.parametrize("line,needle", [
    ("strategy = 5", "key 'strategy' = 5 (integer) is invalid: use a non-empty string (a registered strategy name"),
    ('model = ""', "key 'model' = '' (string) is invalid"),
    ("max_new_tokens = 0", "key 'max_new_tokens' = 0 (integer) is invalid: use an integer >= 1"),
    ('max_new_tokens = "8"', "key 'max_new_tokens' = '8' (string) is invalid"),
    ("max_new_tokens = true", "key 'max_new_tokens' = True (boolean) is invalid"),
    ("budget = 3", "key 'budget' = 3 (integer) is invalid: use a budget policy name"),
    ("device = []", "key 'device' = [] (array) is invalid"),
    ("dtype = 1.5", "key 'dtype' = 1.5 (float) is invalid"),
    ("draft_model = {}", "key 'draft_model' = {} (table) is invalid"),
])
def test_toml_values_of_the_wrong_type_are_refused(tmp_path, line, needle):
    (tmp_path / "lightspec.toml").write_text(line + "\n")
    with pytest.raises(ConfigError) as info:
        load_defaults(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'lightspec.toml'}: {needle}")
    (tmp_path / "lightspec.toml").unlink()
    (tmp_path / "pyproject.toml").write_text("[tool.lightspec]\n" + line + "\n")
    with pytest.raises(ConfigError, match=r"pyproject.toml \[tool.lightspec\]: key"):
        load_defaults(tmp_path)


def test_toml_valid_values_and_bom_are_accepted(tmp_path):
    body = 'strategy = "ngram"\nmax_new_tokens = 8\n[budget]\ntype = "static"\nk = 3\n'
    (tmp_path / "lightspec.toml").write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert load_defaults(tmp_path) == {"strategy": "ngram", "max_new_tokens": 8, "budget": {"type": "static", "k": 3}}


def test_toml_not_utf8_names_the_line(tmp_path):
    (tmp_path / "lightspec.toml").write_bytes(b'strategy = "ngram"\nmodel = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"lightspec.toml:2: not valid UTF-8 \(byte 0xe9\)"):
        load_defaults(tmp_path)


def test_toml_strategy_int_on_the_cli(monkeypatch, tmp_path, model_dir):
    (tmp_path / "lightspec.toml").write_text("strategy = 5\n")
    rc, _, err = cli(["run", "--model", model_dir, "--prompt", "the"], tmp_path, monkeypatch)
    one_error_line(rc, err, "lightspec.toml: key 'strategy' = 5 (integer) is invalid")


# -- 7. bench --limit, run --threads -------------------------------------------------------


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_bench_limit_below_one_is_refused(monkeypatch, tmp_path, model_dir, limit):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    rc, _, err = cli(["bench", "--model", model_dir, "--prompts", str(prompts), "--limit", limit], tmp_path, monkeypatch)
    one_error_line(rc, err, f"--limit {limit} is invalid: use an integer >= 1")


def test_run_threads(monkeypatch, tmp_path, model_dir):
    rc, _, err = cli(["run", "--model", model_dir, "--prompt", "the", "--threads", "0"], tmp_path, monkeypatch)
    one_error_line(rc, err, "--threads 0 is invalid: use an integer >= 1")
    before = torch.get_num_threads()
    try:
        rc, out, err = cli(["run", "--model", model_dir, "--prompt", "the", "--threads", "1", "--max-new-tokens", "2",
                            "--json", "--strategy", "none"], tmp_path, monkeypatch)
        assert rc == 0, err
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# -- 8. EOS ids ------------------------------------------------------------------------------


def test_eos_token_id_through_the_api(pipe):
    free = pipe.generate([[5, 6, 7]], max_new_tokens=6, ignore_eos=True)[0].token_ids
    stop_at = free[2]
    first = free.index(stop_at)
    out = pipe.generate([[5, 6, 7]], max_new_tokens=6, eos_token_id=stop_at)[0]
    assert out.token_ids == free[: first + 1] and out.finish_reason == "stop"
    assert pipe.generate([[5, 6, 7]], max_new_tokens=6, eos_token_id=[stop_at, 95])[0].token_ids == free[: first + 1]
    assert pipe.generate([[5, 6, 7]], max_new_tokens=6, eos_token_id=[])[0].token_ids == free
    with pytest.raises(InvalidValueError, match=rf"eos_token_id {TINY_VOCAB} is outside this model's vocabulary: "
                                                rf"allowed ids are \[0, {TINY_VOCAB}\)"):
        pipe.generate([[5]], eos_token_id=[2, TINY_VOCAB])
    with pytest.raises(InvalidTypeError, match=r"eos_token_id='2' \(str\) is invalid"):
        pipe.generate([[5]], eos_token_id="2")
    with pytest.raises(InvalidValueError, match=r"eos_token_id=2 with ignore_eos=True: give one of them"):
        pipe.generate([[5]], eos_token_id=2, ignore_eos=True)
    with pytest.raises(InvalidTypeError, match=r"ignore_eos='yes' \(str\) is invalid: use True or False"):
        pipe.generate([[5]], ignore_eos="yes")


def test_ignore_eos_runs_past_the_models_eos():
    model, tok = tiny_model(), tiny_tokenizer()
    p = MTPPipeline(model, tok, strategy="none")
    free = p.generate([[5, 6, 7]], max_new_tokens=5, eos_token_id=[])[0].token_ids
    model.generation_config.eos_token_id = free[1]
    p = MTPPipeline(model, tok, strategy="none")
    assert p.generate([[5, 6, 7]], max_new_tokens=5)[0].token_ids == free[: free.index(free[1]) + 1]
    assert p.generate([[5, 6, 7]], max_new_tokens=5, ignore_eos=True)[0].token_ids == free


def test_eos_flags_on_the_cli(monkeypatch, tmp_path, model_dir):
    base = ["run", "--model", model_dir, "--strategy", "none", "--prompt", "the cat", "--max-new-tokens", "6", "--json"]
    rc, _, err = cli(base + ["--eos-token-id", "999999"], tmp_path, monkeypatch)
    one_error_line(rc, err, f"eos_token_id 999999 is outside this model's vocabulary: allowed ids are [0, {TINY_VOCAB})")
    rc, out, err = cli(base + ["--ignore-eos"], tmp_path, monkeypatch)
    assert rc == 0, err
    free = json.loads(out)[0]["token_ids"]
    assert len(free) == 6
    rc, out, err = cli(base + ["--eos-token-id", str(free[1]), "--eos-token-id", "95"], tmp_path, monkeypatch)
    assert rc == 0, err
    assert json.loads(out)[0]["token_ids"] == free[: free.index(free[1]) + 1]
    rc, _, err = cli(base + ["--eos-token-id", "3", "--ignore-eos"], tmp_path, monkeypatch)
    one_error_line(rc, err, "--eos-token-id 3 with --ignore-eos: give one of them")
    rc, _, err = cli(base + ["--eos-token-id", "-4"], tmp_path, monkeypatch)
    one_error_line(rc, err, "--eos-token-id -4 is invalid")
    # --ignore-eos: a copy of the model whose EOS is the second greedy token
    ignore_dir = save_tiny(tmp_path / "eos_model")
    cfg = json.loads((ignore_dir / "generation_config.json").read_text())
    cfg["eos_token_id"] = free[1]
    (ignore_dir / "generation_config.json").write_text(json.dumps(cfg))
    base[2] = str(ignore_dir)
    rc, out, err = cli(base, tmp_path, monkeypatch)
    assert rc == 0 and json.loads(out)[0]["token_ids"] == free[: free.index(free[1]) + 1], err
    rc, out, err = cli(base + ["--ignore-eos"], tmp_path, monkeypatch)
    assert rc == 0 and json.loads(out)[0]["token_ids"] == free, err


# -- 9. the CLI never shows a traceback without --debug --------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["run", "--max-new-tokens", "abc"], "Invalid value for '--max-new-tokens': 'abc' is not a valid integer"),
    (["run", "--no-such-flag"], "No such option '--no-such-flag'"),
    (["bench", "--limit", "x"], "Invalid value for '--limit': 'x' is not a valid integer"),
    (["frobnicate"], "No such command 'frobnicate'"),
])
def test_click_usage_errors_are_one_line(monkeypatch, tmp_path, args, needle):
    rc, _, err = cli(args, tmp_path, monkeypatch)
    one_error_line(rc, err, needle)


def test_keyboard_interrupt_is_one_line(monkeypatch, tmp_path, model_dir):
    import lightspec_core.cli as cli_mod

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_mod, "read_prompts", interrupted)
    rc, _, err = cli(["run", "--model", model_dir, "--prompt", "the"], tmp_path, monkeypatch)
    assert rc == 130 and err.split() == ["aborted"], err


def test_unexpected_errors_are_one_line(monkeypatch, tmp_path, model_dir):
    import lightspec_core.cli as cli_mod

    def broken(*a):
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(cli_mod, "read_prompts", broken)
    rc, _, err = cli(["run", "--model", model_dir, "--prompt", "the"], tmp_path, monkeypatch)
    assert rc == 1 and err.strip().splitlines() == [
        "error: RuntimeError: first line second line (run with --debug for the traceback)"], err


@pytest.mark.parametrize("body,needle", [
    (b"one\n\xff\n", "p.txt:2: not valid UTF-8 (byte 0xff at byte 1 of the line)"),
])
def test_prompts_file_errors_on_the_cli(monkeypatch, tmp_path, model_dir, body, needle):
    (tmp_path / "p.txt").write_bytes(body)
    rc, _, err = cli(["run", "--model", model_dir, "--prompts-file", str(tmp_path / "p.txt")], tmp_path, monkeypatch)
    one_error_line(rc, err, needle)


def test_no_command_prints_the_help_not_an_error(monkeypatch, tmp_path):
    rc, out, err = cli([], tmp_path, monkeypatch)
    assert "Usage:" in out + err and "Commands:" in out + err and "error:" not in out + err
