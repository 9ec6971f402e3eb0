"""Loading target and draft models as the Hugging Face ecosystem does, with one clear
error line per bad input.

A model is named as transformers names it: a local folder written by ``save_pretrained``,
or a hub id (``org/name``) that ``AutoModelForCausalLM.from_pretrained`` resolves through
the Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``), downloading what is missing when
the hub can be reached and reading only the cache under ``HF_HUB_OFFLINE=1``.

What can go wrong is checked in the order loading meets it, each with its own message:
the name (no such folder, an empty folder, a file, a hub id missing from the cache while
offline), the config (not a causal LM: encoder-decoder models such as T5, encoders such
as BERT whose attention looks both ways), the tokenizer files, the weights (a truncated
or corrupt ``.safetensors`` file), and the vocabulary (``check_vocabulary``).

Models LightSpec loads itself get its CPU kernels on the CPU in float32
(``install_cpu_kernels``); models passed in as objects are only checked
(``check_passed_model``), never moved, cast, put in eval mode or re-built.
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from .errors import InvalidTypeError, InvalidValueError, LightSpecError

# a few decoder-only families, named in the "not a causal LM" message (transformers knows ~200)
CAUSAL_EXAMPLES = "Llama, Mistral, Qwen2/Qwen3, Gemma, GPT-2, GPT-NeoX, Phi-3, OPT"
# the files a saved tokenizer is read from (any one of them, besides tokenizer_config.json)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "tokenizer.tiktoken")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def load_model(name, device: torch.device, dtype: torch.dtype, progress: bool = False, cpu_layout: bool = True,
               config=None):
    """Load the causal LM ``name`` (a local folder or a hub id, see the module docstring)
    with ``AutoModelForCausalLM.from_pretrained(name, dtype=dtype)``, move it to ``device``
    and return it in eval mode.

    ``cpu_layout``: on the CPU in float32, install LightSpec's CPU kernels into it
    (``install_cpu_kernels``: the same values, 2-3x faster decode steps); ``False`` returns
    the model exactly as transformers built it.  ``progress``: name the model and its
    source on stderr and show transformers' progress bars; without it they are hidden.
    ``config``: the model's config as ``load_config`` returned it and ``check_causal_lm``
    accepted it (read and checked here when not given).
    Raises ``LightSpecError`` (one line) for every input it cannot load."""
    from transformers import AutoModelForCausalLM

    name = str(name)
    if config is None:
        config = load_config(name, progress)
        check_causal_lm(config, name)
    with _progress_bars(progress):
        try:
            model, info = AutoModelForCausalLM.from_pretrained(name, config=config, dtype=dtype, output_loading_info=True)
        except Exception as exc:
            raise _weights_error(name, exc) from exc
    if info.get("missing_keys"):
        raise _missing_weights_error(name, config, sorted(info["missing_keys"]), info.get("unexpected_keys") or [])
    model = model.to(device).eval()
    if cpu_layout and cpu_kernels_apply(device, dtype):
        install_cpu_kernels(model)
    return model


def load_tokenizer(name, progress: bool = False):
    """``AutoTokenizer.from_pretrained(name)``; a ``LightSpecError`` naming the model and
    the files it needs when there is no usable tokenizer."""
    from transformers import AutoTokenizer

    name = str(name)
    if Path(name).is_file():
        raise InvalidValueError(f"model {name!r} is a file: give the folder that holds its config.json, or a hub id (org/name)")
    if not Path(name).is_dir() and (not _REPO_ID.match(name) or ".." in name):
        raise InvalidValueError(f"model {name!r} not found: no such folder, and not a hub id (org/name)")
    with _progress_bars(progress):
        try:
            return AutoTokenizer.from_pretrained(name)
        except Exception as exc:
            if _offline_miss(exc):
                raise _not_cached(name) from exc
            folder = local_folder(name)
            if folder is not None and not any((folder / f).is_file() for f in TOKENIZER_FILES):
                raise LightSpecError(
                    f"model {name!r} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}, with "
                    "tokenizer_config.json): save the tokenizer into its folder (tokenizer.save_pretrained) "
                    "or pass tokenizer=..."
                ) from exc
            raise LightSpecError(f"the tokenizer of model {name!r} cannot be loaded ({_first_line(exc)}): "
                                 "the folder needs the tokenizer files saved with the model, or pass tokenizer=...") from exc


def load_config(name: str, progress: bool = False):
    """The model's config (``AutoConfig.from_pretrained``), after checking that ``name``
    is a model folder or a hub id."""
    from transformers import AutoConfig

    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            empty = not any(path.iterdir())
            raise LightSpecError(
                f"model folder {name!r} {'is empty' if empty else 'has no config.json'}: give a folder written by "
                "save_pretrained (config.json, *.safetensors, tokenizer files) or a hub id (org/name)")
    elif path.exists():
        raise InvalidValueError(f"model {name!r} is a file: give the folder that holds its config.json, or a hub id (org/name)")
    elif not _REPO_ID.match(name) or ".." in name:
        raise InvalidValueError(f"model {name!r} not found: no such folder, and not a hub id (org/name)")
    elif _offline() and not _cached_config(name):
        raise _not_cached(name)
    if progress:
        print(f"loading {name} from {_source(name)}…", file=sys.stderr, flush=True)
    with _progress_bars(progress):
        try:
            return AutoConfig.from_pretrained(name)
        except Exception as exc:
            raise _config_error(name, exc) from exc


def check_causal_lm(config, name: str) -> None:
    """Refuse a config that ``AutoModelForCausalLM`` would not build as a causal LM.

    Refused: encoder-decoder models (T5, BART: ``is_encoder_decoder``); model types with
    no causal-LM class; checkpoints saved only with non-causal heads (``architectures``
    such as ``BertForMaskedLM``); and encoders (BERT, RoBERTa, ...) with
    ``is_decoder=false``, whose attention looks both ways: transformers would load those
    as a decoder (``BertLMHeadModel``) with a warning, and speculative decoding would
    silently verify against a model that sees tokens after the one it predicts."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    what = f"model {name!r} ({model_type}, {type(config).__name__})"
    allowed = (f"LightSpec runs decoder-only causal LMs, the models transformers builds with AutoModelForCausalLM "
               f"({CAUSAL_EXAMPLES}, ...: a *ForCausalLM class)")
    if getattr(config, "is_encoder_decoder", False):
        raise InvalidValueError(f"{what} is an encoder-decoder model, not a causal LM: {allowed}")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise InvalidValueError(f"{what} is not a causal LM: {allowed}")
    causal_classes = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    archs = list(getattr(config, "architectures", None) or [])
    if archs and not any(a in causal_classes or a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        raise InvalidValueError(f"{what} was saved as {', '.join(archs)}, not a causal LM: {allowed}")
    if (model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False)
            and not getattr(config, "causal", False)):
        raise InvalidValueError(f"{what} is an encoder with is_decoder=false (its attention looks both ways), "
                             f"not a causal LM: {allowed}")


def check_vocabulary(model, tokenizer, what: str = "the model") -> None:
    """Refuse a model whose output vocabulary (lm_head rows) is smaller than its
    tokenizer's length: the tokenizer would produce ids the model has no logits for."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is None or not hasattr(tokenizer, "__len__"):
        return
    rows, n = int(weight.shape[0]), len(tokenizer)
    if rows < n:
        raise InvalidValueError(f"{what} has a vocabulary of {rows} tokens (lm_head rows) but its tokenizer has {n}: "
                             "the model needs at least as many rows as len(tokenizer); use the tokenizer saved "
                             "with the model")


def check_passed_model(model, device, dtype, what: str = "model") -> tuple[torch.device, torch.dtype]:
    """Check a model object passed in by the caller, without changing it, and return its
    (device, dtype).

    ``device`` / ``dtype`` (``None``: accept the model's own) must match where the model
    is; a mismatch is an error asking the caller to move it.  A model with a module in
    training mode (dropout active) is an error too: LightSpec never calls ``.eval()``
    or ``.to()`` on a model it did not load."""
    from .pipeline import resolve_device, resolve_dtype

    if not isinstance(model, torch.nn.Module):
        raise InvalidTypeError(f"the {what} is a {type(model).__name__}: pass a torch.nn.Module, a folder or a hub id")
    have_dev, have_dt = model_device(model), model_dtype(model)
    label = f"the {what} passed ({type(model).__name__})"
    if device is not None:
        want = device if isinstance(device, torch.device) else resolve_device(device)
        if not _same_device(want, have_dev):
            raise InvalidValueError(f"{label} is on {have_dev}, but device={str(want)!r} was asked: move it first "
                                 f"(model.to({str(want)!r})) or leave device unset to use it where it is")
    if dtype is not None:
        want_dt = resolve_dtype(dtype, have_dev)
        if want_dt != have_dt:
            wanted, has = str(want_dt).removeprefix("torch."), str(have_dt).removeprefix("torch.")
            raise InvalidValueError(f"{label} is {has}, but dtype={wanted!r} was asked: convert it first "
                                 f"(model.to(torch.{wanted})) or leave dtype unset to use it as it is")
    training = next((n or "(the model itself)" for n, m in model.named_modules() if m.training), None)
    if training is not None:
        raise InvalidValueError(f"{label} is in training mode (module {training}: dropout would change its outputs): "
                             "call model.eval() before passing it")
    return have_dev, have_dt


def model_device(model) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def model_dtype(model) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 if it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def cpu_kernels_apply(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``install_cpu_kernels`` changes a model at this device and dtype."""
    return torch.device(device).type == "cpu" and dtype == torch.float32


def install_cpu_kernels(model) -> None:
    """Install LightSpec's CPU kernels into ``model``, in place: its Linear weights packed
    for ``lightspec_kernels.cpu_linear`` (``PackedLinear``; column-major where the kernel
    cannot run), its RMSNorms as ``KernelRMSNorm`` and its attention as ``"lightspec_cpu"``.
    The same values (the logits differ in the last bits), 2-3x faster decode steps; every
    forward of the model, HF's ``generate`` included, then runs them.  Needs float32 on
    the CPU."""
    from .cpu_norm import use_cpu_norms
    from .hf_attention import use_cpu_attention
    from .weight_layout import use_cpu_layout

    if not cpu_kernels_apply(model_device(model), model_dtype(model)):
        raise InvalidValueError(f"cpu_kernels=True needs a float32 model on the CPU; this one is "
                             f"{str(model_dtype(model)).removeprefix('torch.')} on {model_device(model)}: "
                             "leave cpu_kernels unset")
    use_cpu_layout(model)
    use_cpu_norms(model)
    use_cpu_attention(model)


def has_cpu_kernels(model) -> bool:
    """Whether any of LightSpec's CPU kernels is installed in ``model``."""
    from .cpu_norm import KernelRMSNorm
    from .hf_attention import uses_cpu_attention
    from .weight_layout import PackedLinear, is_column_major

    return uses_cpu_attention(model) or any(
        isinstance(m, (PackedLinear, KernelRMSNorm)) or (isinstance(m, torch.nn.Linear) and is_column_major(m.weight))
        for m in model.modules())


def local_folder(name: str) -> Path | None:
    """The folder the files of ``name`` are read from: the folder itself, or a hub id's
    snapshot in the Hugging Face cache; None when neither exists."""
    if Path(name).is_dir():
        return Path(name)
    cached = _cached_config(name)
    return Path(cached).parent if cached else None


# -- errors -------------------------------------------------------------------------------


def _config_error(name: str, exc: BaseException) -> LightSpecError:
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    if _offline_miss(exc):
        return _not_cached(name)
    if _in_chain(exc, GatedRepoError):
        return LightSpecError(f"model {name!r} is gated on the Hugging Face hub: accept its terms on its page and "
                              "log in (`hf auth login`), or pass a local folder")
    if _in_chain(exc, RepositoryNotFoundError):
        return LightSpecError(f"model {name!r} is neither a local folder nor a model on the Hugging Face hub (a private "
                              "one needs `hf auth login`)")
    if _in_chain(exc, EntryNotFoundError):
        return LightSpecError(f"model {name!r} has no config.json: not a transformers model")
    return LightSpecError(f"cannot read the config of model {name!r}: {_first_line(exc)}")


def _weights_error(name: str, exc: BaseException) -> LightSpecError:
    if _offline_miss(exc):
        return _not_cached(name)
    folder = local_folder(name)
    if type(exc).__name__ == "SafetensorError" and folder is not None:
        bad = _unreadable_safetensors(folder)
        if bad:
            return LightSpecError(f"model {name!r}: weights file {bad[0]} is unreadable ({_first_line(exc)}): it is "
                                  "truncated or corrupt; download or save it again")
    if isinstance(exc, OSError) and "no file named" in str(exc):
        return LightSpecError(f"model {name!r} has a config.json but no weights (model.safetensors or "
                              "pytorch_model.bin, or their sharded index): download or save them again")
    return LightSpecError(f"cannot load the weights of model {name!r}: {type(exc).__name__}: {_first_line(exc)}")


def _missing_weights_error(name: str, config, missing: list[str], unexpected) -> LightSpecError:
    """transformers fills weights a checkpoint lacks with random values and only warns; a
    drafter's checkpoint of another kind passed as a model is the usual cause."""
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    eagle = any(str(k).endswith("fc.weight") for k in unexpected) and getattr(config, "num_hidden_layers", 0) == 1
    hint = ("it is an EAGLE-3 head: use --strategy eagle3 (head=... or --draft-model)" if eagle
            else "save or download the model again")
    return LightSpecError(f"model {name!r} lacks {len(missing)} of the weights its config needs ({shown}); "
                          f"transformers would fill them with random values: {hint}")


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _not_cached(name: str, what: str = "model") -> LightSpecError:
    from huggingface_hub import constants

    why = "HF_HUB_OFFLINE=1" if _offline() else "the hub cannot be reached"
    return LightSpecError(
        f"{what} {name!r} is not (fully) in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}: run "
        f"`hf download {name}` on a machine with network, then copy the cache here (or point HF_HUB_CACHE at it), "
        "or pass a local model folder")


def _offline_miss(exc: BaseException) -> bool:
    """Whether a load failed because a file was neither cached nor downloadable."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if _in_chain(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return True
    # transformers re-raises an offline miss as a plain OSError without its cause
    return _offline() and isinstance(exc, OSError) and "couldn't connect" in str(exc).lower()


def _in_chain(exc: BaseException | None, types) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, types):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _unreadable_safetensors(folder: Path) -> list[str]:
    from safetensors import safe_open

    bad = []
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except Exception:
            bad.append(f.name)
    return bad


def _cached_config(name: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    if not _REPO_ID.match(name):
        return None
    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # an id the hub client rejects
        return None
    return found if isinstance(found, str) else None


def _source(name: str) -> str:
    if Path(name).is_dir():
        return "a local folder"
    from huggingface_hub import constants

    return "the Hugging Face cache" if _cached_config(name) else f"the Hugging Face hub (into {constants.HF_HUB_CACHE})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 240 else line[:237] + "..."


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


@contextmanager
def _progress_bars(show: bool):
    """Hide transformers' and huggingface_hub's progress bars unless ``show`` (they stay
    as the user configured them when shown)."""
    if show:
        yield
        return
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    tf_on, hub_off = hf_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    hub_utils.disable_progress_bars()
    try:
        yield
    finally:
        if tf_on:
            hf_logging.enable_progress_bar()
        if not hub_off:
            hub_utils.enable_progress_bars()
