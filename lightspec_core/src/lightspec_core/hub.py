"""Finding a checkpoint's folder from what a user wrote: a local folder or a hub id.

Drafters whose weights are not a transformers model (EAGLE-3 heads, DSpark blocks, Medusa
heads, the MTP modules inside a target's own checkpoint) read their files themselves, so
they need a folder, not a model object.  ``model_folder`` gives them one the way
transformers resolves a model name: a local folder as it is, else a hub id (``org/name``)
through the Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``), downloading what is
missing when the hub can be reached and reading only the cache under ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import InvalidTypeError, InvalidValueError, LightSpecError
from .loading import _REPO_ID, _first_line, _in_chain, _not_cached, _offline, _offline_miss, _progress_bars

# what a drafter checkpoint is read from: configs, weights in every public container, token maps
CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.txt")


def model_folder(name, what: str = "checkpoint", download: bool = True, progress: bool = False,
                 allow_patterns: tuple[str, ...] | list[str] | None = CHECKPOINT_FILES) -> Path:
    """The local folder holding checkpoint ``name``.

    ``name``: a folder (``str`` or ``Path``), returned as it is; or a hub id
    (``"org/name"``, optionally ``"org/name@revision"``), resolved to its snapshot in the
    Hugging Face cache.  With ``download`` (default) the files matching ``allow_patterns``
    (``None``: all) that are missing from the cache are downloaded when the hub can be
    reached (``huggingface_hub.snapshot_download``); without it, or under
    ``HF_HUB_OFFLINE=1``, only the cache is read.  ``what`` names the checkpoint in errors
    (``"EAGLE-3 head"``); ``progress`` shows the hub's download bars.

    Raises ``InvalidValueError`` for a name that is neither a folder nor a hub id (a file,
    a missing path) and ``LightSpecError`` for a hub id that is not cached while offline, not
    on the hub, or gated -- one line naming ``name`` and what to do.

    Example::

        folder = model_folder("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", what="EAGLE-3 head")
        config = json.loads((folder / "config.json").read_text())
    """
    if not isinstance(name, (str, Path)) or not str(name):
        raise InvalidTypeError(f"{what} {name!r} is invalid: give a folder or a hub id (org/name)")
    path = Path(name)
    if path.is_dir():
        return path
    text = str(name)
    if path.exists():
        raise InvalidValueError(f"{what} {text!r} is a file: give the folder that holds its config.json, or a hub id (org/name)")
    repo, _, revision = text.partition("@")
    if "/" not in repo or not _REPO_ID.match(repo) or ".." in repo:
        raise InvalidValueError(f"{what} {text!r} not found: no such folder, and not a hub id (org/name)")
    from huggingface_hub import snapshot_download

    offline = _offline() or not download
    if progress and not offline:
        print(f"fetching {what} {text} from the Hugging Face hub…", file=sys.stderr, flush=True)
    with _progress_bars(progress):
        try:
            found = snapshot_download(repo, revision=revision or None, allow_patterns=list(allow_patterns or []) or None,
                                      local_files_only=offline)
        except Exception as exc:
            raise _hub_error(text, what, exc, offline) from exc
    return Path(found)


def _hub_error(name: str, what: str, exc: BaseException, offline: bool) -> LightSpecError:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if offline or _offline_miss(exc):
        return _not_cached(name, what)
    if _in_chain(exc, GatedRepoError):
        return LightSpecError(f"{what} {name!r} is gated on the Hugging Face hub: accept its terms on its page and log in "
                              "(`hf auth login`), or pass a local folder")
    if _in_chain(exc, RevisionNotFoundError):
        return LightSpecError(f"{what} {name!r}: no such revision on the Hugging Face hub")
    if _in_chain(exc, RepositoryNotFoundError):
        return LightSpecError(f"{what} {name!r} is neither a local folder nor a repository on the Hugging Face hub "
                              "(a private one needs `hf auth login`)")
    return LightSpecError(f"cannot fetch {what} {name!r} from the Hugging Face hub: {_first_line(exc)}")
