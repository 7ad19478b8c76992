"""The run-kind registry: names -> :class:`~posenc.kinds.base.RunKind` instances.

Kinds register themselves with the :func:`register` decorator in their own module::

    @register
    class Translation(RunKind):
        name = "translation"
        ...

The registry is filled the first time it is queried, as the encoder registry is
(:mod:`posenc.encodings.registry`), from every module of the ``posenc.kinds`` package and from the
``posenc.kinds`` entry-point group of installed distributions, so a third-party package adds a
kind of run without touching posenc::

    [options.entry_points]            # setup.cfg
    posenc.kinds =
        contrastive = my_package.contrastive

An entry point names a module (importing it runs its decorators) or a ``RunKind`` subclass (which
is registered). A plugin that fails to load is reported by a warning naming the entry point.

This module imports nothing from the kind modules, so they can import :func:`register`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil
import warnings

import ml_collections

from posenc.kinds.base import RunKind

ENTRY_POINT_GROUP = "posenc.kinds"
_PACKAGE = "posenc.kinds"

_REGISTRY: dict[str, RunKind] = {}
_loaded = False


def register(cls: type[RunKind]) -> type[RunKind]:
    """Adds a kind (an instance of ``cls``) to the registry under ``cls.name``; a class decorator.

    Registering the same class twice is a no-op; another class under a taken name is refused.

    Raises:
      TypeError: ``cls`` is not a ``RunKind`` subclass.
      ValueError: ``cls.name`` is empty or already names another class.
    """
    if not (inspect.isclass(cls) and issubclass(cls, RunKind)):
        raise TypeError(f"register expects a RunKind subclass, got {cls!r}")
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`")
    taken = _REGISTRY.get(cls.name)
    if taken is not None and type(taken) is not cls:
        kind = type(taken)
        raise ValueError(
            f"run kind {cls.name!r} is already registered by "
            f"{kind.__module__}.{kind.__qualname__}; "
            f"refusing {cls.__module__}.{cls.__qualname__}"
        )
    if taken is None:
        _REGISTRY[cls.name] = cls()
    return cls


def unregister(name: str) -> None:
    """Removes a kind (tests that register a toy kind take it out again)."""
    _REGISTRY.pop(name, None)


def _ensure_loaded() -> None:
    """Fills the registry from the package and the entry points, once per process."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # set first: a plugin that queries the registry while loading must not loop
    try:
        package = importlib.import_module(_PACKAGE)
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{_PACKAGE}.{module.name}")
    except BaseException:
        _loaded = False
        raise
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        label = f"{entry_point.name} = {entry_point.value}"
        try:
            loaded = entry_point.load()
            if inspect.isclass(loaded):
                register(loaded)
            elif not inspect.ismodule(loaded):
                raise TypeError(
                    f"it names a {type(loaded).__name__}, not a module or a RunKind subclass"
                )
        except Exception as err:  # a broken plugin must not break posenc
            warnings.warn(
                f"posenc could not load the run-kind plugin {label!r} (entry point group "
                f"{ENTRY_POINT_GROUP!r}): {type(err).__name__}: {err}",
                RuntimeWarning,
                stacklevel=3,
            )


def kinds() -> list[RunKind]:
    """Every registered kind, in the order they are asked (:attr:`RunKind.precedence`, name)."""
    _ensure_loaded()
    return sorted(_REGISTRY.values(), key=lambda k: (k.precedence, k.name))


def names() -> list[str]:
    """The registered kinds' names, sorted."""
    _ensure_loaded()
    return sorted(_REGISTRY)


def get(name: str) -> RunKind:
    """The kind registered as ``name``; an unknown name is refused naming the known ones."""
    _ensure_loaded()
    if name not in _REGISTRY:
        raise ValueError(f"unknown run kind {name!r}; run kinds: {', '.join(names())}")
    return _REGISTRY[name]


def kind_of(config: ml_collections.ConfigDict) -> RunKind:
    """The kind that runs ``config``: the first, in :attr:`RunKind.precedence` order, that claims
    it.

    Raises:
      ValueError: an unknown ``model.assembly`` (named as :func:`posenc.models.build.assembly`
        names it, whichever kind is asked first), or a config no kind claims (listing what
        chooses each kind).
    """
    from posenc.models.build import assembly

    assembly(config)  # the field every kind's claim reads: one message for a bad value
    for kind in kinds():
        if kind.claims(config):
            return kind
    choices = "; ".join(f"{k.name}: {k.chosen_by}" for k in kinds())
    raise ValueError(f"no run kind claims this config ({choices})")


def require(config: ml_collections.ConfigDict, name: str, what: str) -> RunKind:
    """The kind ``name``, after refusing in one line naming both kinds a ``config`` another kind
    runs: ``what`` (a command, an option) needs a ``name`` run."""
    wanted, kind = get(name), kind_of(config)
    if kind is not wanted:
        raise ValueError(
            f"{what} needs a {name} run ({wanted.chosen_by}); this is a {kind.name} run "
            f"({kind.chosen_by})"
        )
    return wanted
