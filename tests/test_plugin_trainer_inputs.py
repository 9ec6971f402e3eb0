"""The plugins' commands that load a target (``eagle3 train``, ``dspark train``, ``mtplayer
train`` and both ``shrink-vocab``) load it as the pipeline does: a folder that does not exist,
a file, or a hub id missing from the cache while offline is one ``error:`` line naming it
(exit 2), where they used to print transformers' own messages ("Repo id must be in the form
'repo_name' or 'namespace/repo_name'")."""

from __future__ import annotations

import re

import pytest
from helpers import offline_hub_cache, run_cli


def commands(target: str, tmp_path) -> dict[str, list[str]]:
    data = str(tmp_path / "data.txt")
    return {
        "eagle3 train": ["eagle3", "train", "--target", target, "--data", data, "--out", str(tmp_path / "e"),
                         "--max-steps", "1"],
        "dspark train": ["dspark", "train", "--target", target, "--data", data, "--out", str(tmp_path / "d"),
                         "--steps", "1"],
        "mtplayer train": ["mtplayer", "train", "--target", target, "--data", data, "--out", str(tmp_path / "m"),
                           "--max-steps", "1"],
        "eagle3 shrink-vocab": ["eagle3", "shrink-vocab", "--head", str(tmp_path), "--target", target, "--data", data,
                                "--draft-vocab", "4", "--out", str(tmp_path / "s")],
        "dspark shrink-vocab": ["dspark", "shrink-vocab", "--drafter", str(tmp_path), "--target", target, "--data",
                                data, "--draft-vocab", "4", "--out", str(tmp_path / "t")],
    }


@pytest.mark.parametrize("command", ["eagle3 train", "dspark train", "mtplayer train", "eagle3 shrink-vocab",
                                     "dspark shrink-vocab"])
def test_a_bad_target_is_one_error_line_naming_it(command, tmp_path, monkeypatch, capsys):
    offline_hub_cache(tmp_path, monkeypatch)
    (tmp_path / "data.txt").write_text("the cat the cat one two three " * 50)
    (tmp_path / "weights.safetensors").write_bytes(b"x")
    cases = {
        str(tmp_path / "nope"): "not found: no such folder, and not a hub id",
        str(tmp_path / "weights.safetensors"): "is a file: give the folder that holds its config.json",
        "org/missing": r"is not \(fully\) in the Hugging Face cache .* HF_HUB_OFFLINE=1: run `hf download org/missing`",
    }
    for target, message in cases.items():
        rc, out, err = run_cli(commands(target, tmp_path)[command], capsys)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert rc == 2 and len(lines) == 1, (target, err)
        assert f"model {target!r}" in lines[0] and "Traceback" not in err, lines[0]
        assert re.search(message, lines[0]), lines[0]
