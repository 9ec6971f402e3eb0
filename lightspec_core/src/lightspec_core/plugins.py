"""Plugin discovery (stevedore), hook registration (pluggy) and the component registry.

Plugins are distributions that declare an entry point in the ``lightspec.plugins``
namespace; the object it points at (usually a module) implements hooks from
``hookspecs.py``.  The core's built-in components are registered by the same hooks
(``lightspec_core.builtins``).  A plugin that fails to import or register is reported
and skipped, unless strict mode is on.  "Fails" includes ``BaseException``s other than
``KeyboardInterrupt`` (a plugin module calling ``sys.exit()`` or raising ``GeneratorExit``
at import): stevedore itself catches only ``Exception`` while loading.
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import pluggy

from . import hookspecs
from .errors import LightSpecError, PluginError

log = logging.getLogger("lightspec.plugins")

NAMESPACE = "lightspec.plugins"
KINDS = ("strategy", "verifier", "budget", "fusion", "sink")
KNOWN_HOOKS = {name for name in dir(hookspecs) if name.startswith("lightspec_")}


@dataclass
class Component:
    """One registered component: ``factory(**options)`` builds it."""

    name: str
    kind: str
    factory: Callable[..., Any]
    description: str
    params: dict[str, str]
    plugin: str
    distribution: str
    version: str


@dataclass
class PluginInfo:
    name: str
    distribution: str
    version: str
    hooks: list[str]
    components: list[str] = field(default_factory=list)


@dataclass
class PluginFailure:
    name: str
    distribution: str
    entry_point: str
    error: str

    def __str__(self) -> str:
        return f"plugin {self.name!r} (distribution {self.distribution}, entry point {self.entry_point}) failed: {self.error}"


def validate_hooks(obj: Any, label: str) -> list[str]:
    """Check ``obj``'s hook implementations; return the hook names it implements.

    Raises PluginError for an attribute named ``lightspec_*`` that is not a known hook
    (a misspelling) and for hook wrappers on per-step hooks (they are resolved once and
    called directly, so a wrapper would silently never run).
    """
    implemented = []
    for attr in dir(obj):
        if not attr.startswith("lightspec_"):
            continue
        value = getattr(obj, attr, None)
        if not callable(value):
            continue
        if attr not in KNOWN_HOOKS:
            close = difflib.get_close_matches(attr, sorted(KNOWN_HOOKS), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise PluginError(
                f"{label}: {attr!r} is not a LightSpec hook{hint}; known hooks: {', '.join(sorted(KNOWN_HOOKS))}"
            )
        opts = getattr(value, hookspecs.PROJECT + "_impl", None)
        if opts and (opts.get("hookwrapper") or opts.get("wrapper")):
            why = "per-step hooks are resolved once and called directly" if attr in hookspecs.PER_STEP_HOOKS else "registration hooks are called directly"
            raise PluginError(f"{label}: {attr} cannot be a hook wrapper: {why}")
        implemented.append(attr)
    return implemented


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


class PluginRegistry:
    """Loaded plugins, their components and the failures met while loading."""

    def __init__(self) -> None:
        self.pm = new_plugin_manager()
        self.plugins: dict[str, PluginInfo] = {}
        self.components: dict[tuple[str, str], Component] = {}
        self.failures: list[PluginFailure] = []

    # -- loading -------------------------------------------------------------------------

    def add_plugin(self, obj: Any, name: str, distribution: str = "lightspec-core", version: str = "") -> None:
        """Register one plugin object and the components it provides."""
        hooks = validate_hooks(obj, f"plugin {name!r} ({distribution})")
        self.pm.register(obj, name=name)
        try:
            self.pm.check_pending()
            info = PluginInfo(name=name, distribution=distribution, version=version, hooks=hooks)
            impl = getattr(obj, "lightspec_register_strategies", None)
            added: list[tuple[str, str]] = []
            if impl is not None:

                def register(cname, factory, *, kind="strategy", description="", params=None):
                    self._register_component(cname, factory, kind, description, params, info, added)

                try:
                    impl(register=register)
                except BaseException:
                    for key in added:
                        self.components.pop(key, None)
                    raise
            info.components = [f"{k}:{n}" for k, n in added]
            self.plugins[name] = info
        except BaseException:
            self.pm.unregister(obj)
            raise

    def _register_component(self, name, factory, kind, description, params, info: PluginInfo, added) -> None:
        if kind not in KINDS:
            raise PluginError(f"plugin {info.name!r}: component {name!r} has kind={kind!r}; allowed kinds: {', '.join(KINDS)}")
        if not isinstance(name, str) or not name or not callable(factory):
            raise PluginError(f"plugin {info.name!r}: register() needs a non-empty name and a callable factory, got {name!r}")
        key = (kind, name)
        if key in self.components:
            other = self.components[key]
            raise PluginError(
                f"{kind} {name!r} is provided twice: by plugin {other.plugin!r} ({other.distribution}) "
                f"and by plugin {info.name!r} ({info.distribution})"
            )
        self.components[key] = Component(
            name=name,
            kind=kind,
            factory=factory,
            description=description or (getattr(factory, "__doc__", "") or "").strip().split("\n")[0],
            params=dict(params or {}),
            plugin=info.name,
            distribution=info.distribution,
            version=info.version,
        )
        added.append(key)

    def load_entry_points(self, allow: list[str] | None = None, strict: bool = False) -> None:
        """Discover and load plugins of the ``lightspec.plugins`` namespace with stevedore.

        ``allow``: only these entry-point names (None = all, [] = none).
        """
        if allow is not None and not allow:
            return
        from stevedore import ExtensionManager, NamedExtensionManager

        def on_failure(manager, entry_point, exc):
            self._fail(entry_point, exc.original if isinstance(exc, _ImportFailed) else exc, strict)

        ExtensionManager.ENTRY_POINT_CACHE.pop(NAMESPACE, None)  # see plugins installed since the last look
        common = dict(invoke_on_load=False, on_load_failure_callback=on_failure, verify_requirements=False)
        if allow is None:
            manager = _tolerant(ExtensionManager)(namespace=NAMESPACE, **common)
        else:  # import only the allowed plugins; a missing or failed one is reported below, not by stevedore
            manager = _tolerant(NamedExtensionManager)(namespace=NAMESPACE, names=allow, name_order=True,
                                                       warn_on_missing_entrypoint=False, **common)
        found = set()
        for ext in manager.extensions:
            found.add(ext.name)
            dist_name, version = _distribution(ext.entry_point)
            try:
                self.add_plugin(ext.plugin, ext.name, dist_name, version)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # a broken plugin never crashes the core, nor ends the process
                self._fail(ext.entry_point, exc, strict)
        failed = {f.name for f in self.failures}
        for name in allow or []:
            if name not in found and name not in self.plugins and name not in failed:  # not already reported
                msg = f"LIGHTSPEC_PLUGINS names {name!r}, but no installed plugin has that entry point name"
                if strict:
                    raise PluginError(msg)
                self.failures.append(PluginFailure(name, "?", "?", msg))
                log.warning(msg)

    def _fail(self, entry_point, exc: BaseException, strict: bool) -> None:
        failure = PluginFailure(
            name=getattr(entry_point, "name", str(entry_point)),
            distribution=_distribution(entry_point)[0],
            entry_point=getattr(entry_point, "value", str(entry_point)),
            error=describe_failure(exc),
        )
        if strict:
            raise PluginError(f"{failure} (strict plugin loading is on)") from exc
        self.failures.append(failure)
        log.warning("%s; skipped", failure)

    def register_commands(self, cli, strict: bool = False) -> None:
        """Call every plugin's ``lightspec_register_commands(cli)`` on its own: one that raises
        (anything but KeyboardInterrupt, ``SystemExit`` included) is reported and skipped, as a
        plugin that fails to load is (fatal in strict mode)."""
        for impl in self.pm.hook.lightspec_register_commands.get_hookimpls():
            try:
                impl.function(cli=cli)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - a plugin must not end the CLI
                info = self.plugins.get(impl.plugin_name)
                failure = PluginFailure(impl.plugin_name, info.distribution if info else "?",
                                        "lightspec_register_commands", describe_failure(exc))
                if strict:
                    raise PluginError(f"{failure} (strict plugin loading is on)") from None
                self.failures.append(failure)
                log.warning("%s; its commands are skipped", failure)

    # -- lookups -------------------------------------------------------------------------

    def get(self, kind: str, name: str) -> Component:
        try:
            return self.components[(kind, name)]
        except KeyError:
            known = sorted(n for k, n in self.components if k == kind)
            raise LightSpecError(f"unknown {kind} {name!r}; available: {', '.join(known) or 'none'}") from None

    def names(self, kind: str) -> list[str]:
        return sorted(n for k, n in self.components if k == kind)

    def create(self, kind: str, name: str, /, **options) -> Any:
        comp = self.get(kind, name)
        unknown = set(options) - set(comp.params) if comp.params else set()
        if unknown:
            raise LightSpecError(
                f"{kind} {name!r} has no option {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(comp.params)) or 'none'}"
            )
        obj = comp.factory(**options)
        validate_hooks(obj, f"{kind} {name!r} from plugin {comp.plugin!r}")
        if not getattr(obj, "name", None):
            try:
                obj.name = name
            except AttributeError:
                pass
        return obj


class _ImportFailed(Exception):
    """Carries a ``BaseException`` raised while importing a plugin through stevedore,
    which passes only ``Exception``s to the failure callback."""

    def __init__(self, original: BaseException):
        super().__init__(describe_failure(original))
        self.original = original


def _tolerant(manager_cls: type) -> type:
    """A subclass of the stevedore manager ``manager_cls`` whose per-plugin load turns every
    ``BaseException`` but ``KeyboardInterrupt`` into an ``Exception`` (``_ImportFailed``),
    so stevedore reports it to the failure callback and goes on with the next plugin
    instead of letting ``SystemExit`` (or ``AssertionError``, which it re-raises) end the
    process.  Discovery and loading stay stevedore's."""

    class Tolerant(manager_cls):
        def _load_one_plugin(self, ep, *args, **kwargs):
            try:
                return super()._load_one_plugin(ep, *args, **kwargs)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                raise _ImportFailed(exc) from exc

    Tolerant.__name__ = Tolerant.__qualname__ = f"Tolerant{manager_cls.__name__}"
    return Tolerant


def describe_failure(exc: BaseException) -> str:
    """One line for a plugin failure: ``"Type: message"``; for a ``BaseException`` that is
    not an ``Exception`` (``SystemExit``, ``GeneratorExit``) it also says what it would
    have done had it not been caught."""
    text = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, Exception):
        text += f" (a plugin must not raise {type(exc).__name__}: it would have ended the process)"
    return text


def _distribution(entry_point) -> tuple[str, str]:
    """(distribution name, version) that declares ``entry_point``; stevedore's cached
    entry points carry no ``.dist``, so look it up in the installed metadata."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        from importlib.metadata import entry_points

        for ep in entry_points(group=NAMESPACE):
            if ep.name == getattr(entry_point, "name", None) and ep.value == getattr(entry_point, "value", None):
                dist = ep.dist
                break
    if dist is None:
        return "?", ""
    return dist.metadata["Name"], dist.version


_registry: PluginRegistry | None = None


def env_allow_list() -> list[str] | None:
    raw = os.environ.get("LIGHTSPEC_PLUGINS")
    if raw is None:
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def env_strict() -> bool:
    return os.environ.get("LIGHTSPEC_STRICT_PLUGINS", "").strip().lower() in ("1", "true", "yes", "on")


def get_registry(*, reload: bool = False, strict: bool | None = None, allow: list[str] | None | str = "env") -> PluginRegistry:
    """The process-wide registry: built-ins plus the installed plugins (loaded once)."""
    global _registry
    if _registry is None or reload:
        from . import builtins

        reg = PluginRegistry()
        reg.add_plugin(builtins, "builtin", "lightspec-core", _core_version())
        reg.load_entry_points(allow=env_allow_list() if allow == "env" else allow, strict=env_strict() if strict is None else strict)
        _registry = reg
    return _registry


def _core_version() -> str:
    try:
        from importlib.metadata import version

        return version("lightspec-core")
    except Exception:
        return "0+unknown"
