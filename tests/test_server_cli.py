"""``lightspec serve`` (a real process on a free loopback port) and ``lightspec run
--batch-size``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from helpers import save_tiny
from lightspec_core.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("serve_model")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_batch_size_splits_the_prompts_with_a_progress_bar(model_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    words = ["the cat is red", "def x ( ) :", "one two one two", "hello world", "a big dog"]
    prompts.write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
    base = ["run", "--model", model_dir, "--strategy", "ngram", "--prompts-file", str(prompts),
            "--max-new-tokens", "6", "--json"]
    assert main(base) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(base + ["--batch-size", "2"]) == 0
    out = capsys.readouterr()
    split = json.loads(out.out)
    assert [d["prompt"] for d in split] == words
    assert [d["token_ids"] for d in split] == [d["token_ids"] for d in whole]
    assert "5/5" in out.err  # the progress bar, on stderr


@pytest.mark.parametrize("args,needle", [
    (["run", "--prompt", "a", "--batch-size", "0"], "--batch-size 0 is invalid: use an integer >= 1"),
    (["serve", "--port", "70000"], "--port 70000 is invalid"),
    (["serve", "--batch-size", "0"], "--batch-size 0 is invalid"),
    (["serve", "--max-queue", "-1"], "--max-queue -1 is invalid"),
])
def test_bad_options_are_one_line(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_serve_command_answers_the_openai_client(model_dir):
    port = _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "lightspec_core.cli", "serve", "--model", model_dir, "--strategy",
                             "ngram", "--port", str(port), "--batch-size", "4", "--served-model-name", "tiny",
                             "--api-key", "k"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no start"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        r = client.completions.create(model="tiny", prompt="the cat is", max_tokens=5, temperature=0)
        assert r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 130), proc.stderr.read()
