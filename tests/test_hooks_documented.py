"""Every hook in ``hookspecs.py`` is documented in ``docs/hooks.md`` (heading with its
exact signature, calling convention, a runnable example) and has a test of its own —
a test function named ``test_hook_<short>_...`` somewhere under ``tests/``, where
``<short>`` is the hook name without ``lightspec_`` — and the page's examples run."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from lightspec_core import hookspecs

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "hooks.md"
TESTS = Path(__file__).resolve().parent


def hooks() -> dict[str, object]:
    """Hook name -> specification function, for every hook of the ``lightspec`` project."""
    marker = hookspecs.PROJECT + "_spec"
    return {n: f for n, f in vars(hookspecs).items() if n.startswith("lightspec_") and hasattr(f, marker)}


def signature(name: str, fn) -> str:
    return f"{name}{inspect.signature(fn)}"


def sections(text: str) -> dict[str, str]:
    """``### `signature``` heading -> the text up to the next heading of level <= 3."""
    out = {}
    parts = re.split(r"^(#{1,3} .*)$", text, flags=re.M)
    for head, body in zip(parts[1::2], parts[2::2]):
        m = re.match(r"### `(lightspec_\w+\(.*\))`\s*$", head)
        if m:
            out[m.group(1)] = body
    return out


def doc_problems(text: str) -> list[str]:
    problems = []
    secs = sections(text)
    for name, fn in hooks().items():
        sig = signature(name, fn)
        body = secs.get(sig)
        if body is None:
            problems.append(f"{sig}: no '### `{sig}`' section in docs/hooks.md")
            continue
        firstresult = getattr(fn, hookspecs.PROJECT + "_spec").get("firstresult", False)
        if firstresult and "firstresult" not in body:
            problems.append(f"{sig}: the section does not say the hook is firstresult")
        if not firstresult and not re.search(r"every\s+implementation\s+is\s+called|collected", body, re.I):
            problems.append(f"{sig}: the section does not say every implementation is called")
        blocks = re.findall(r"```python\n(.*?)```", body, re.S)
        if not any(name in b for b in blocks):
            problems.append(f"{sig}: no ```python example that implements {name}")
    return problems


def hook_tests() -> dict[str, list[str]]:
    """Hook name -> the ``test_hook_<short>...`` functions found under tests/."""
    found: dict[str, list[str]] = {name: [] for name in hooks()}
    for path in TESTS.rglob("test_*.py"):
        text = path.read_text(encoding="utf-8")
        for name in found:
            short = name[len("lightspec_"):]
            for m in re.finditer(rf"^\s*def (test_hook_{short}(?:_\w+)?)\(", text, re.M):
                found[name].append(f"{path.name}::{m.group(1)}")
    return found


def test_hookspecs_are_found():
    names = set(hooks())
    assert {"lightspec_propose", "lightspec_verify", "lightspec_fuse", "lightspec_budget", "lightspec_on_stats",
            "lightspec_register_strategies", "lightspec_register_commands"} <= names


def test_every_hook_is_documented_with_its_signature():
    assert doc_problems(DOC.read_text(encoding="utf-8")) == []


def test_the_checker_catches_an_undocumented_hook():
    text = DOC.read_text(encoding="utf-8")
    sig = signature("lightspec_verify", hooks()["lightspec_verify"])
    broken = text.replace(f"### `{sig}`", "### verification")
    assert any(p.startswith(sig) for p in doc_problems(broken))
    renamed = text.replace(f"### `{sig}`", "### `lightspec_verify(ctx, proposal)`")
    assert any("no '###" in p for p in doc_problems(renamed))


def test_lifecycle_and_rules_are_documented():
    text = DOC.read_text(encoding="utf-8")
    for needle in ("setup(env)", "reset()", "hidden_layers", "once per pipeline", "wrapper", "firstresult"):
        assert needle in text, needle
    for name in hookspecs.PER_STEP_HOOKS:
        assert name in text


def test_every_hook_has_a_test_of_its_own():
    missing = [name for name, tests in hook_tests().items() if not tests]
    assert missing == [], f"hooks without a test named test_hook_<short>_...: {missing}"


def test_the_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= len(hooks()) + 1
    namespace: dict = {"__name__": "docs_hooks_examples"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/hooks.md[python block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message says which block
            pytest.fail(f"docs/hooks.md python block {i} failed: {type(exc).__name__}: {exc}")
