"""LightSpec's model zoo: small, real, offline models for speculative decoding.

>>> import lightspec_zoo
>>> lightspec_zoo.available()
['draft', 'target']
>>> path = lightspec_zoo.model_path()          # the default target model folder
>>> # AutoTokenizer.from_pretrained(path); AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

Each model is a standard Hugging Face folder (config.json, model.safetensors in float16,
tokenizer files, generation_config.json, README.md model card).  The target and the draft
share one tokenizer.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_TARGET", "DEFAULT_DRAFT", "MODELS_DIR", "PROMPTS_DIR", "WORKLOADS", "ModelNotFoundError", "available", "prompt_sets",
           "model_path", "load"]
__version__ = "0.1.0"

DEFAULT_TARGET = "target"
DEFAULT_DRAFT = "draft"
MODELS_DIR = Path(__file__).resolve().parent / "models"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class ModelNotFoundError(FileNotFoundError):
    """A zoo model (or its weights) is not installed."""


def _complete(folder: Path) -> bool:
    return folder.is_dir() and all((folder / f).is_file() for f in _REQUIRED)


def available() -> list[str]:
    """Names of the zoo models whose weights are installed, sorted."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in MODELS_DIR.iterdir() if _complete(p))


def model_path(name: str = DEFAULT_TARGET) -> Path:
    """Folder of zoo model `name` (loadable with transformers' from_pretrained).

    Raises ModelNotFoundError with rebuild instructions if the weights are missing.
    """
    folder = MODELS_DIR / name
    if not _complete(folder):
        missing = [f for f in _REQUIRED if not (folder / f).is_file()]
        raise ModelNotFoundError(
            f"lightspec-zoo model {name!r} is not installed at {folder} "
            f"(missing: {', '.join(missing)}; installed: {available() or 'none'}). "
            "Rebuild the weights with `bash zoo/scripts/cpu_train_all.sh` (CPU) or "
            "`bash zoo/scripts/gpu_train_all.sh` + `zoo/scripts/unpack_gpu_out.sh` (GPU), "
            "then reinstall lightspec-zoo.")
    return folder


def load(name: str = DEFAULT_TARGET, dtype=None, device=None):
    """Convenience: (tokenizer, model) for zoo model `name`, in float32 on CPU by default."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(name)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    if device is not None:
        model = model.to(device)
    return tok, model.eval()


PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
WORKLOADS = ("code", "docstring", "edit", "prose", "spec_bench")


def prompt_sets(workloads=WORKLOADS) -> dict[str, list[str]]:
    """The benchmark suite's held-out prompts: {workload: [prompt, ...]}.

    ``spec_bench`` is the first turn of each Spec-Bench question (Apache-2.0, see
    ``prompts/spec_bench/README.md``); the others come from held-out files of the training
    corpus (see ``prompts/README.md``).
    """
    import json

    sets: dict[str, list[str]] = {}
    for w in workloads:
        if w == "spec_bench":
            path = PROMPTS_DIR / "spec_bench" / "question.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            sets[w] = [r["turns"][0] for r in rows]
        else:
            path = PROMPTS_DIR / f"{w}.jsonl"
            if not path.is_file():
                raise FileNotFoundError(f"workload {w!r} has no prompt file at {path}; known: {', '.join(WORKLOADS)}")
            sets[w] = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    return sets
