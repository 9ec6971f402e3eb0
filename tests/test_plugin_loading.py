"""Plugin loading: good, broken (reported and skipped), strict mode, allow-list, duplicate
names, misspelled hooks and per-step hook wrappers.

Most tests replace stevedore's ``ExtensionManager`` with an in-process fake that behaves
like it (it imports every entry point and reports import errors through
``on_load_failure_callback``), so they are fast and isolated from what is installed.
The ``real_*`` tests go through real stevedore discovery of distributions on sys.path
(``tests/fault_plugins`` among them).  One file for every loading case (over 400 lines):
they share the fake stevedore and its fixtures.
"""

from __future__ import annotations

import json
import logging
import os
import textwrap
import types
from types import SimpleNamespace

import pytest
from lightspec_core.plugins import get_registry

from lightspec_core import PluginError, hookimpl
from lightspec_core import plugins as plugins_mod

NS = "lightspec.plugins"


# --- fake plugins and a fake stevedore ------------------------------------------------


class Strategy:
    """A trivial component (drafts nothing)."""

    def __init__(self, **options):
        self.options = options


def make_plugin(name: str, strategies=(), **hooks) -> types.ModuleType:
    """A module-like plugin object registering ``strategies`` plus any extra ``hooks``."""
    mod = types.ModuleType(f"{name}_mod")
    if strategies is not None:

        @hookimpl
        def lightspec_register_strategies(register):
            for s in strategies:
                register(s, Strategy, description=f"{s} from {name}")

        mod.lightspec_register_strategies = lightspec_register_strategies
    for attr, fn in hooks.items():
        setattr(mod, attr, fn)
    return mod


def entry_point(name: str, dist: str):
    return SimpleNamespace(
        name=name, value=f"{name}_mod.plugin", group=NS, dist=SimpleNamespace(metadata={"Name": dist}, version="1.2.3")
    )


class FakeManager:
    """Stands in for stevedore's (Named)ExtensionManager over ``FakeManager.available``:
    a list of (entry-point name, distribution, loader); a loader returns the plugin
    object or raises like a failing import.  Like stevedore, it loads each plugin through
    ``_load_one_plugin`` and hands only ``Exception``s (not ``KeyboardInterrupt`` nor
    ``AssertionError``) to ``on_load_failure_callback``: anything else escapes."""

    available: list = []
    created = 0
    imported: list = []

    def __init__(self, namespace, names=None, invoke_on_load=False, on_load_failure_callback=None,
                 verify_requirements=False, **kwargs):
        assert namespace == NS
        type(self).created += 1
        self.extensions = []
        loaders = {name: loader for name, _, loader in self.available}
        for name, dist, _ in self.available:
            if names is not None and name not in names:
                continue
            ep = entry_point(name, dist)
            ep.load = loaders[name]
            try:
                ext = self._load_one_plugin(ep, invoke_on_load, (), {})
            except (KeyboardInterrupt, AssertionError):
                raise
            except Exception as exc:
                if on_load_failure_callback is None:
                    raise
                on_load_failure_callback(self, ep, exc)
                continue
            self.extensions.append(ext)

    def _load_one_plugin(self, ep, invoke_on_load, invoke_args, invoke_kwds):
        type(self).imported.append(ep.name)
        return SimpleNamespace(name=ep.name, entry_point=ep, plugin=ep.load(), obj=None)


@pytest.fixture
def fake_plugins(monkeypatch):
    """``fake_plugins(*(name, dist, loader))`` installs a fake entry-point set; returns
    FakeManager.  The environment has no LIGHTSPEC_* variables; the process-wide
    registry is restored afterwards."""
    import stevedore

    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.setenv("LIGHTSPEC_STRICT_PLUGINS", "0")
    monkeypatch.setattr(plugins_mod, "_registry", None)
    manager = type("Manager", (FakeManager,), {"available": [], "created": 0, "imported": [], "ENTRY_POINT_CACHE": {}})
    monkeypatch.setattr(stevedore, "ExtensionManager", manager)
    monkeypatch.setattr(stevedore, "NamedExtensionManager", manager)

    def install(*entries):
        manager.available = list(entries)
        return manager

    return install


def good(name, strategies=("s_" + "good",), dist=None, **hooks):
    return (name, dist or f"lightspec-{name}", lambda: make_plugin(name, strategies=strategies, **hooks))


def broken(name, exc=None):
    def loader():
        raise exc or ImportError(f"No module named '{name}_missing_dependency'")

    return (name, f"lightspec-{name}", loader)


# --- good and broken plugins ----------------------------------------------------------


def test_good_plugin_registered_with_components(fake_plugins):
    fake_plugins(good("alpha", strategies=("alpha_s",)))
    reg = get_registry(reload=True)
    info = reg.plugins["alpha"]
    assert (info.distribution, info.version) == ("lightspec-alpha", "1.2.3")
    assert info.hooks == ["lightspec_register_strategies"]
    assert info.components == ["strategy:alpha_s"]
    comp = reg.get("strategy", "alpha_s")
    assert (comp.plugin, comp.distribution, comp.description) == ("alpha", "lightspec-alpha", "alpha_s from alpha")
    assert isinstance(reg.create("strategy", "alpha_s"), Strategy)
    assert "builtin" in reg.plugins and "ngram" in reg.names("strategy")
    assert reg.failures == []


def test_broken_plugin_reported_and_skipped(fake_plugins, caplog):
    fake_plugins(good("alpha", strategies=("alpha_s",)), broken("beta"))
    with caplog.at_level(logging.WARNING, logger="lightspec.plugins"):
        reg = get_registry(reload=True)
    assert "beta" not in reg.plugins and "alpha" in reg.plugins
    [f] = reg.failures
    assert (f.name, f.distribution, f.entry_point) == ("beta", "lightspec-beta", "beta_mod.plugin")
    assert f.error == "ImportError: No module named 'beta_missing_dependency'"
    msg = str(f)
    for part in ("beta", "lightspec-beta", "beta_mod.plugin", "ImportError", "beta_missing_dependency"):
        assert part in msg
    assert any("beta_missing_dependency" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)


def test_core_keeps_working_with_a_broken_plugin(fake_plugins):
    from helpers import cached_tiny, hf_reference

    from lightspec_core import MTPPipeline

    fake_plugins(broken("beta", RuntimeError("boom at import")))
    reg = get_registry(reload=True)
    assert reg.failures[0].error == "RuntimeError: boom at import"
    model, tok = cached_tiny()
    out = MTPPipeline(model, tok, strategy="ngram").generate("one two one two one", max_new_tokens=6)
    ref = hf_reference(model, tok, "one two one two one", 6)
    assert out.token_ids == (ref[: ref.index(2) + 1] if 2 in ref else ref)


def test_plugin_failing_in_register_is_rolled_back(fake_plugins):
    @hookimpl
    def lightspec_register_strategies(register):
        register("half_done", Strategy)
        raise RuntimeError("registration failed")

    mod = types.ModuleType("gamma_mod")
    mod.lightspec_register_strategies = lightspec_register_strategies
    fake_plugins(("gamma", "lightspec-gamma", lambda: mod))
    reg = get_registry(reload=True)
    assert "gamma" not in reg.plugins
    assert "half_done" not in reg.names("strategy")
    assert reg.pm.get_plugin("gamma") is None
    assert "RuntimeError: registration failed" in str(reg.failures[0])


def test_bad_component_kind_is_a_plugin_error(fake_plugins):
    @hookimpl
    def lightspec_register_strategies(register):
        register("odd", Strategy, kind="drafter")

    mod = types.ModuleType("delta_mod")
    mod.lightspec_register_strategies = lightspec_register_strategies
    fake_plugins(("delta", "lightspec-delta", lambda: mod))
    reg = get_registry(reload=True)
    assert "kind='drafter'" in reg.failures[0].error and "allowed kinds" in reg.failures[0].error


# --- strict mode ----------------------------------------------------------------------


def test_strict_argument_makes_a_broken_plugin_fatal(fake_plugins):
    fake_plugins(good("alpha"), broken("beta"))
    with pytest.raises(PluginError) as err:
        get_registry(reload=True, strict=True)
    msg = str(err.value)
    assert "\n" not in msg
    assert "beta" in msg and "lightspec-beta" in msg and "beta_missing_dependency" in msg and "strict" in msg


def test_strict_env_makes_a_broken_plugin_fatal(fake_plugins, monkeypatch):
    fake_plugins(broken("beta"))
    monkeypatch.setenv("LIGHTSPEC_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="beta"):
        get_registry(reload=True)
    monkeypatch.setenv("LIGHTSPEC_STRICT_PLUGINS", "0")
    assert get_registry(reload=True).failures[0].name == "beta"


def _cli_main(monkeypatch, capsys, argv):
    from lightspec_core import cli as cli_mod

    monkeypatch.setattr(cli_mod.cli, "_plugins_loaded", False, raising=False)
    monkeypatch.setattr(plugins_mod, "_registry", None)
    rc = cli_mod.main(argv)
    return rc, capsys.readouterr()


def test_cli_strict_plugins_flag_is_fatal_in_one_line(fake_plugins, monkeypatch, capsys):
    fake_plugins(good("alpha"), broken("beta"))
    rc, cap = _cli_main(monkeypatch, capsys, ["--strict-plugins", "plugins"])
    assert rc != 0
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    assert lines[0].startswith("error:") and "beta" in lines[0] and "lightspec-beta" in lines[0]
    assert "Traceback" not in cap.err + cap.out


def test_cli_strict_plugins_env_is_fatal(fake_plugins, monkeypatch, capsys):
    fake_plugins(broken("beta"))
    monkeypatch.setenv("LIGHTSPEC_STRICT_PLUGINS", "1")
    rc, cap = _cli_main(monkeypatch, capsys, ["strategies"])
    assert rc != 0
    assert len(cap.err.strip().splitlines()) == 1 and "beta" in cap.err


def test_cli_plugins_reports_failures_without_strict(fake_plugins, monkeypatch, capsys):
    fake_plugins(good("alpha", strategies=("alpha_s",)), broken("beta"))
    rc, cap = _cli_main(monkeypatch, capsys, ["plugins", "--json"])
    assert rc == 0, cap.err
    data = json.loads(cap.out)
    rows = {p["name"]: p for p in data["plugins"]}
    assert rows["alpha"]["strategies"] == ["alpha_s"] and rows["alpha"]["distribution"] == "lightspec-alpha"
    [f] = data["failures"]
    assert (f["name"], f["distribution"], f["entry_point"]) == ("beta", "lightspec-beta", "beta_mod.plugin")
    assert "ImportError" in f["error"]


# --- allow-list -----------------------------------------------------------------------


def test_allow_list_loads_only_named_plugins(fake_plugins, monkeypatch):
    fake_plugins(good("a", strategies=("a_s",)), good("b", strategies=("b_s",)), good("c", strategies=("c_s",)))
    monkeypatch.setenv("LIGHTSPEC_PLUGINS", " a, b ")
    reg = get_registry(reload=True)
    assert set(reg.plugins) == {"builtin", "a", "b"}
    assert "c_s" not in reg.names("strategy") and {"a_s", "b_s"} <= set(reg.names("strategy"))
    assert reg.failures == []


def test_empty_allow_list_loads_no_plugin(fake_plugins, monkeypatch):
    manager = fake_plugins(good("a"), broken("beta"))
    monkeypatch.setenv("LIGHTSPEC_PLUGINS", "")
    reg = get_registry(reload=True)
    assert set(reg.plugins) == {"builtin"}
    assert reg.failures == [] and manager.imported == []
    assert "ngram" in reg.names("strategy")  # the built-ins are always there


def test_allow_list_naming_a_missing_plugin_is_reported(fake_plugins, monkeypatch):
    fake_plugins(good("a"))
    monkeypatch.setenv("LIGHTSPEC_PLUGINS", "a,nope")
    reg = get_registry(reload=True)
    assert "a" in reg.plugins
    assert [f.name for f in reg.failures] == ["nope"] and "nope" in reg.failures[0].error
    with pytest.raises(PluginError, match="nope"):
        get_registry(reload=True, strict=True)


def test_allow_list_does_not_import_other_plugins(fake_plugins, monkeypatch):
    """A plugin left out of LIGHTSPEC_PLUGINS is not imported, so it cannot fail."""
    manager = fake_plugins(good("a"), broken("beta"))
    monkeypatch.setenv("LIGHTSPEC_PLUGINS", "a")
    reg = get_registry(reload=True, strict=True)
    assert set(reg.plugins) == {"builtin", "a"} and reg.failures == []
    assert manager.imported == ["a"]


# --- duplicates -----------------------------------------------------------------------


def test_duplicate_strategy_names_name_both_plugins(fake_plugins):
    fake_plugins(good("first", strategies=("same",)), good("second", strategies=("same",)))
    reg = get_registry(reload=True)
    assert reg.get("strategy", "same").plugin == "first"
    [f] = reg.failures
    assert f.name == "second"
    for part in ("'same'", "'first'", "lightspec-first", "'second'", "lightspec-second"):
        assert part in f.error
    with pytest.raises(PluginError, match="provided twice"):
        get_registry(reload=True, strict=True)


def test_duplicate_of_a_builtin_strategy(fake_plugins):
    fake_plugins(good("shadow", strategies=("ngram",)))
    reg = get_registry(reload=True)
    assert reg.get("strategy", "ngram").plugin == "builtin"
    assert "'builtin'" in reg.failures[0].error and "'shadow'" in reg.failures[0].error


def test_same_name_of_another_kind_is_allowed(fake_plugins):
    @hookimpl
    def lightspec_register_strategies(register):
        register("ngram", Strategy, kind="sink")

    mod = types.ModuleType("m")
    mod.lightspec_register_strategies = lightspec_register_strategies
    fake_plugins(("sinks", "lightspec-sinks", lambda: mod))
    reg = get_registry(reload=True)
    assert reg.failures == [] and reg.get("sink", "ngram").plugin == "sinks"


# --- misspelled hooks and wrappers ----------------------------------------------------


def test_misspelled_hook_is_an_error_at_load(fake_plugins):
    @hookimpl
    def lightspec_register_strategy(register):  # missing "ies"
        pass

    fake_plugins(good("typo", lightspec_register_strategy=lightspec_register_strategy))
    reg = get_registry(reload=True)
    assert "typo" not in reg.plugins and "s_good" not in reg.names("strategy")
    err = reg.failures[0].error
    assert "'lightspec_register_strategy' is not a LightSpec hook" in err
    assert "did you mean lightspec_register_strategies" in err
    with pytest.raises(PluginError, match="not a LightSpec hook"):
        get_registry(reload=True, strict=True)


def test_misspelled_hook_on_a_component_is_an_error_when_built(fake_plugins):
    class Typo:
        @hookimpl
        def lightspec_propse(self, ctx):
            return None

    @hookimpl
    def lightspec_register_strategies(register):
        register("typo_strategy", Typo)

    mod = types.ModuleType("m")
    mod.lightspec_register_strategies = lightspec_register_strategies
    fake_plugins(("typo", "lightspec-typo", lambda: mod))
    reg = get_registry(reload=True)
    with pytest.raises(PluginError, match="did you mean lightspec_propose"):
        reg.create("strategy", "typo_strategy")


def test_per_step_hook_wrapper_is_rejected(fake_plugins):
    @hookimpl(wrapper=True)
    def lightspec_on_stats(event):
        yield

    fake_plugins(good("wrap", lightspec_on_stats=lightspec_on_stats))
    reg = get_registry(reload=True)
    assert "wrap" not in reg.plugins
    assert "lightspec_on_stats cannot be a hook wrapper" in reg.failures[0].error


def test_per_step_hook_wrapper_on_a_component_is_rejected(fake_plugins):
    class Wrapped:
        @hookimpl(hookwrapper=True)
        def lightspec_propose(self, ctx):
            yield

    @hookimpl
    def lightspec_register_strategies(register):
        register("wrapped", Wrapped)

    mod = types.ModuleType("m")
    mod.lightspec_register_strategies = lightspec_register_strategies
    fake_plugins(("w", "lightspec-w", lambda: mod))
    with pytest.raises(PluginError, match="lightspec_propose cannot be a hook wrapper"):
        get_registry(reload=True).create("strategy", "wrapped")


# --- real stevedore discovery ---------------------------------------------------------


def _write_dist(site, dist: str, version: str, ep_name: str, module: str, source: str) -> None:
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{NS}]\n{ep_name} = {module}\n")
    (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def real_site(tmp_path, monkeypatch):
    """A site folder on sys.path holding two distributions: a good plugin and one whose
    import fails; stevedore's per-process caches are emptied for the test."""
    from helpers import forget_discovered_plugins
    from stevedore import ExtensionManager

    site = tmp_path / "site"
    _write_dist(site, "lsdemo-good", "0.3", "demo_good", "lsdemo_good", """
        from lightspec_core import hookimpl

        class Echo:
            name = "demo_echo"

        @hookimpl
        def lightspec_register_strategies(register):
            register("demo_echo", Echo, description="demo strategy")
    """)
    _write_dist(site, "lsdemo-broken", "0.4", "demo_broken", "lsdemo_broken", """
        import os
        os.environ["LSDEMO_BROKEN_IMPORTED"] = "1"
        import lsdemo_dependency_that_is_not_installed
    """)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(ExtensionManager, "ENTRY_POINT_CACHE", {})
    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LSDEMO_BROKEN_IMPORTED", raising=False)
    monkeypatch.setenv("LIGHTSPEC_STRICT_PLUGINS", "0")
    monkeypatch.setattr(plugins_mod, "_registry", None)
    forget_discovered_plugins()
    yield site
    forget_discovered_plugins()


def test_real_discovery_of_good_and_broken_distributions(real_site):
    reg = get_registry(reload=True)
    info = reg.plugins["demo_good"]
    assert (info.distribution, info.version) == ("lsdemo-good", "0.3")
    assert reg.get("strategy", "demo_echo").distribution == "lsdemo-good"
    [f] = [f for f in reg.failures if f.name == "demo_broken"]
    assert f.entry_point == "lsdemo_broken"
    assert f.distribution == "lsdemo-broken"
    assert "ModuleNotFoundError" in f.error and "lsdemo_dependency_that_is_not_installed" in f.error
    with pytest.raises(PluginError, match="demo_broken"):
        get_registry(reload=True, strict=True)


def test_real_discovery_allow_list_skips_other_distributions(real_site, monkeypatch):
    monkeypatch.setenv("LIGHTSPEC_PLUGINS", "demo_good")
    reg = get_registry(reload=True, strict=True)  # the broken one is not even imported
    assert set(reg.plugins) == {"builtin", "demo_good"}
    assert reg.failures == []
    import os

    assert "LSDEMO_BROKEN_IMPORTED" not in os.environ


# --- BaseException from a plugin (SystemExit, GeneratorExit, AssertionError) ------------


def raising(name, exc):
    """A plugin whose import raises ``exc`` (any BaseException)."""

    def loader():
        raise exc

    return (name, f"lightspec-{name}", loader)


BASE_EXCEPTIONS = {"SystemExit0": SystemExit(0), "SystemExit3": SystemExit(3), "GeneratorExit": GeneratorExit(),
                   "AssertionError": AssertionError("assert at import")}


@pytest.mark.parametrize("exc", list(BASE_EXCEPTIONS.values()), ids=list(BASE_EXCEPTIONS))
def test_base_exception_at_import_is_reported_and_skipped(fake_plugins, caplog, exc):
    """stevedore passes only Exceptions to the failure callback (and re-raises
    AssertionError); the loader reports these like any failure and goes on."""
    fake_plugins(raising("exiting", exc), good("alpha", strategies=("alpha_s",)))
    with caplog.at_level(logging.WARNING, logger="lightspec.plugins"):
        reg = get_registry(reload=True)
    assert "exiting" not in reg.plugins
    assert "alpha" in reg.plugins and "alpha_s" in reg.names("strategy")  # the next plugin still loaded
    [f] = reg.failures
    assert (f.name, f.distribution) == ("exiting", "lightspec-exiting")
    assert f.error.startswith(f"{type(exc).__name__}: {exc}")
    if not isinstance(exc, Exception):
        assert "must not raise" in f.error
    assert any("exiting" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)


def test_keyboard_interrupt_at_import_is_not_swallowed(fake_plugins):
    fake_plugins(raising("ctrl_c", KeyboardInterrupt()), good("alpha"))
    with pytest.raises(KeyboardInterrupt):
        get_registry(reload=True)


def test_system_exit_in_registration_is_rolled_back(fake_plugins):
    @hookimpl
    def lightspec_register_strategies(register):
        register("half_done", Strategy)
        raise SystemExit(0)

    mod = types.ModuleType("quitter_mod")
    mod.lightspec_register_strategies = lightspec_register_strategies
    fake_plugins(("quitter", "lightspec-quitter", lambda: mod), good("alpha", strategies=("alpha_s",)))
    reg = get_registry(reload=True)
    assert "quitter" not in reg.plugins and reg.pm.get_plugin("quitter") is None
    assert "half_done" not in reg.names("strategy") and "alpha_s" in reg.names("strategy")
    assert reg.failures[0].error.startswith("SystemExit: 0")


def test_strict_mode_makes_system_exit_at_import_fatal(fake_plugins):
    fake_plugins(good("alpha"), raising("exiting", SystemExit(0)))
    with pytest.raises(PluginError) as err:
        get_registry(reload=True, strict=True)
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("'exiting'", "lightspec-exiting", "SystemExit", "strict"):
        assert part in msg


def test_allow_listed_plugin_failing_is_reported_once(fake_plugins, monkeypatch):
    """An allow-listed plugin whose import fails is one failure (not also 'no installed plugin')."""
    fake_plugins(raising("exiting", SystemExit(0)))
    monkeypatch.setenv("LIGHTSPEC_PLUGINS", "exiting")
    reg = get_registry(reload=True)
    assert [f.name for f in reg.failures] == ["exiting"] and "SystemExit" in reg.failures[0].error


def test_cli_plugins_json_lists_a_system_exit_failure(fake_plugins, monkeypatch, capsys):
    fake_plugins(raising("exiting", SystemExit(0)), good("alpha", strategies=("alpha_s",)))
    rc, cap = _cli_main(monkeypatch, capsys, ["plugins", "--json"])
    assert rc == 0, cap.err
    data = json.loads(cap.out)
    assert "alpha" in {p["name"] for p in data["plugins"]}
    [f] = data["failures"]
    assert f["name"] == "exiting" and f["error"].startswith("SystemExit: 0")


# --- the real fault-injection distributions (tests/fault_plugins) -------------------------


@pytest.fixture
def fault(monkeypatch):
    """``fault(*which)``: the tests/fault_plugins distributions on sys.path, ``which`` of
    them allow-listed; stevedore's caches are emptied afterwards."""
    from fault_plugins import use_fault_plugins
    from helpers import forget_discovered_plugins

    yield lambda *which, **kw: use_fault_plugins(monkeypatch, *which, **kw)
    forget_discovered_plugins()


@pytest.mark.parametrize("raises", ["SystemExit", "GeneratorExit"])
def test_real_plugin_exiting_at_import_is_reported_and_skipped(fault, monkeypatch, raises):
    fault("import", "drafters")
    monkeypatch.setenv("LIGHTSPEC_FAULT_IMPORT_RAISES", raises)
    reg = get_registry(reload=True)
    [f] = reg.failures
    assert (f.name, f.distribution, f.entry_point) == ("fault_import", "lightspec-fault-import",
                                                       "lightspec_fault_import.plugin")
    assert f.error.startswith(raises) and "must not raise" in f.error
    assert "fault_drafters" in reg.plugins and "raises_midway" in reg.names("strategy")


def test_real_plugin_exiting_at_import_with_strict_mode_fails_clearly(fault):
    fault("import", "drafters")
    with pytest.raises(PluginError) as err:
        get_registry(reload=True, strict=True)
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("'fault_import'", "lightspec-fault-import", "SystemExit", "strict"):
        assert part in msg


def test_real_plugins_json_lists_the_exit_at_import(fault, monkeypatch, capsys):
    fault("import", "drafters")
    rc, cap = _cli_main(monkeypatch, capsys, ["plugins", "--json"])
    assert rc == 0, cap.err
    data = json.loads(cap.out)
    assert "fault_drafters" in {p["name"] for p in data["plugins"]}
    [f] = data["failures"]
    assert f["name"] == "fault_import" and f["distribution"] == "lightspec-fault-import"
    assert f["error"].startswith("SystemExit: 0")


def test_real_strict_cli_with_a_plugin_exiting_at_import_is_one_error_line(fault, monkeypatch, capsys):
    fault("import")
    rc, cap = _cli_main(monkeypatch, capsys, ["--strict-plugins", "plugins"])
    assert rc == 2
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "fault_import" in lines[0]
    assert "SystemExit" in lines[0] and "Traceback" not in cap.err + cap.out


def test_real_run_with_a_plugin_exiting_at_import_still_generates(tmp_path):
    """The issue's case, end to end in a fresh interpreter: before the fix `lightspec run`
    exited 0 here without printing anything."""
    import subprocess
    import sys

    from fault_plugins import fault_env
    from helpers import save_tiny

    model = save_tiny(tmp_path / "tiny")
    proc = subprocess.run(
        [sys.executable, "-m", "lightspec_core.cli", "run", "--model", str(model), "--strategy", "none",
         "--prompt", "one two three", "--max-new-tokens", "4", "--json"],
        capture_output=True, text=True, env=fault_env("import", allow_list=False), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout)
    assert result["token_ids"] and result["finish_reason"]
    assert "fault_import" in proc.stderr and "SystemExit" in proc.stderr and "skipped" in proc.stderr


# --- `lightspec plugins` reports the CPU kernels ------------------------------------------


def test_plugins_json_reports_cpu_kernels(fake_plugins, monkeypatch, capsys):
    from lightspec_kernels import _cpu_build

    fake_plugins()
    rc, cap = _cli_main(monkeypatch, capsys, ["plugins", "--json"])
    assert rc == 0, cap.err
    kernels = json.loads(cap.out)["cpu_kernels"]
    expected = _cpu_build.status()
    assert kernels == expected and kernels["on"] == (kernels["reason"] is None)
    rc, cap = _cli_main(monkeypatch, capsys, ["plugins"])
    assert ("cpu kernels: on" if expected["on"] else f"cpu kernels: off ({expected['reason']})") in cap.out


def test_plugins_json_reports_cpu_kernels_off_with_a_hanging_compiler(tmp_path):
    """A compiler that never finishes: `lightspec plugins --json` still answers, with the
    kernels off and why (a fresh interpreter and cache, so that this process's kernels are
    untouched)."""
    import platform
    import subprocess
    import sys

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the CPU kernels are x86-64 only: there is no build to hang")
    cc = tmp_path / "slowcc"
    cc.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo slowcc; exit 0; fi\nexec sleep 600\n')
    cc.chmod(0o755)
    env = dict(os.environ, CC=str(cc), LIGHTSPEC_CACHE_DIR=str(tmp_path / "cache"), LIGHTSPEC_KERNEL_BUILD_TIMEOUT="2",
               LIGHTSPEC_PLUGINS="")
    env.pop("LIGHTSPEC_CPU_KERNEL", None)
    proc = subprocess.run([sys.executable, "-m", "lightspec_core.cli", "plugins", "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    kernels = json.loads(proc.stdout)["cpu_kernels"]
    assert kernels["on"] is False and kernels["reason"].startswith("gave up building the CPU kernels")
    assert kernels["cache_dir"] == str(tmp_path / "cache")
    assert [ln for ln in proc.stderr.splitlines() if "CPU kernels are off" in ln] == [
        f"LightSpec's CPU kernels are off: {kernels['reason']}; PyTorch's operations run instead"]
    assert "building LightSpec's CPU kernels (first run" in proc.stderr
