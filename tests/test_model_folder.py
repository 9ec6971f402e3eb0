"""``lightspec_core.model_folder``: what drafters that read their own files (EAGLE-3 heads,
DSpark checkpoints, Medusa heads, MTP modules) call to turn a folder or a hub id into a folder.
Offline through a temporary HF cache, and "online" with huggingface_hub's ``snapshot_download``
faked (``helpers.fake_online_hub``): nothing reaches the network."""

import pytest
from helpers import HUB_COMMIT, fake_online_hub, offline_hub_cache, put_in_hub_cache, save_tiny

from lightspec_core.errors import LightSpecError


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    return offline_hub_cache(tmp_path, monkeypatch)


def cache_repo(cache, repo):
    src = save_tiny(cache.parent / f"src-{repo.replace('/', '--')}")
    put_in_hub_cache(cache, repo, src)
    return src


def test_model_folder_gives_a_folder_as_it_is_and_a_hub_id_as_its_cached_snapshot(hub_cache, tmp_path):
    """``lightspec_core.model_folder``, what drafters that read their own files (heads) use."""
    from lightspec_core import model_folder

    src = cache_repo(hub_cache, "org/head")
    assert model_folder(src) == src and model_folder(str(src)) == src
    snap = model_folder("org/head", what="EAGLE-3 head")
    assert snap.parent.parent.name == "models--org--head" and (snap / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert model_folder(f"org/head@{HUB_COMMIT}") == snap


@pytest.mark.parametrize("name, pattern", [
    ("org/missing", "EAGLE-3 head 'org/missing' is not .fully. in the Hugging Face cache .* HF_HUB_OFFLINE=1: run `hf download org/missing`"),
    ("no/such/path", "EAGLE-3 head 'no/such/path' not found: no such folder, and not a hub id .org/name."),
    ("nothing", "EAGLE-3 head 'nothing' not found: no such folder, and not a hub id"),
    ("", "EAGLE-3 head '' is invalid: give a folder or a hub id"),
])
def test_model_folder_refuses_what_is_neither_in_one_line(hub_cache, name, pattern):
    from lightspec_core import model_folder

    with pytest.raises(LightSpecError, match=pattern) as err:
        model_folder(name, what="EAGLE-3 head")
    assert "\n" not in str(err.value)


def test_model_folder_refuses_a_file(tmp_path):
    from lightspec_core import model_folder

    (tmp_path / "head.safetensors").write_bytes(b"x")
    with pytest.raises(LightSpecError, match="head.safetensors' is a file: give the folder that holds its config.json"):
        model_folder(tmp_path / "head.safetensors", what="head")


def _hub_error(cls, text):
    """An exception of huggingface_hub's class ``cls`` (they need an HTTP response to build)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, text)
    return exc


@pytest.fixture
def online_hub(tmp_path, monkeypatch):
    return fake_online_hub(tmp_path, monkeypatch)


def test_model_folder_online_fetches_only_the_checkpoint_files(online_hub):
    from lightspec_core import model_folder
    from lightspec_core.hub import CHECKPOINT_FILES

    assert model_folder("org/head@v2", what="EAGLE-3 head") == online_hub["answer"]
    assert model_folder("org/head", allow_patterns=("config.json",)) == online_hub["answer"]
    assert model_folder("org/head", download=False) == online_hub["answer"]
    assert online_hub["calls"] == [("org/head", "v2", list(CHECKPOINT_FILES), False),
                                   ("org/head", None, ["config.json"], False),
                                   ("org/head", None, list(CHECKPOINT_FILES), True)]


@pytest.mark.parametrize("cls, pattern", [
    ("RepositoryNotFoundError", "EAGLE-3 head 'org/x' is neither a local folder nor a repository on the Hugging Face hub"),
    ("GatedRepoError", "EAGLE-3 head 'org/x' is gated on the Hugging Face hub: accept its terms"),
    ("RevisionNotFoundError", "EAGLE-3 head 'org/x': no such revision on the Hugging Face hub"),
    ("LocalEntryNotFoundError", "EAGLE-3 head 'org/x' is not .fully. in the Hugging Face cache .* the hub cannot be reached"),
])
def test_model_folder_online_errors_are_one_line_each(online_hub, cls, pattern):
    import huggingface_hub.errors as hub_errors

    from lightspec_core import model_folder

    online_hub["answer"] = _hub_error(getattr(hub_errors, cls), "404 Client Error")
    with pytest.raises(LightSpecError, match=pattern) as err:
        model_folder("org/x", what="EAGLE-3 head")
    assert "\n" not in str(err.value)
