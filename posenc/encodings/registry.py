"""The encoder registry: names -> :class:`~posenc.encodings.base.Encoding` classes.

Encoders register themselves with the :func:`register` decorator in their own module::

    @register
    @dataclasses.dataclass(frozen=True)
    class Kerple(Encoding):
        name = "kerple"
        ...

The registry is filled, the first time it is queried (:func:`names`, :func:`get_class`,
:func:`get`, :func:`hparam_names`), from two sources:

1. every module of the ``posenc.encodings`` package, found with :func:`pkgutil.iter_modules` and
   imported (which runs its decorators), so adding an encoder to posenc is adding one module;
2. the ``posenc.encodings`` entry-point group of installed distributions, so a third-party
   package adds encoders without touching posenc. An entry point names a module (importing it
   runs its decorators) or an ``Encoding`` subclass (which is registered)::

       [options.entry_points]            # setup.cfg
       posenc.encodings =
           kerple = my_package.kerple

   A plugin that fails to load is reported by a warning naming the entry point; the rest of the
   registry works as before.

Because loading is lazy and happens in whichever process asks, the CLI and sweep child processes,
which only call ``posenc.encodings.get(name)``, see plugins too.

This module imports nothing from the encoder modules, so they can import :func:`register`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import pkgutil
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from posenc.encodings.base import Encoding

ENTRY_POINT_GROUP = "posenc.encodings"
_PACKAGE = "posenc.encodings"

_REGISTRY: dict[str, type[Encoding]] = {}
# Entry points that failed to load: "name = value" -> the error, for `get_class`'s message.
_FAILED_PLUGINS: dict[str, str] = {}
_loaded = False


def register(cls: type[Encoding]) -> type[Encoding]:
    """Adds an encoder class to the registry under ``cls.name``; use it as a class decorator.

    Registering the same class twice is a no-op; a different class under a taken name is refused.

    Raises:
      TypeError: if ``cls`` is not an ``Encoding`` subclass.
      ValueError: if ``cls.name`` is empty or already names another class.
    """
    if not (inspect.isclass(cls) and issubclass(cls, Encoding)):
        raise TypeError(f"register expects an Encoding subclass, got {cls!r}")
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`")
    taken = _REGISTRY.get(cls.name)
    if taken is not None and taken is not cls:
        raise ValueError(
            f"encoding name {cls.name!r} is already registered by "
            f"{taken.__module__}.{taken.__qualname__}; refusing {cls.__module__}.{cls.__qualname__}"
        )
    _REGISTRY[cls.name] = cls
    return cls


def _import_package_modules() -> None:
    """Imports every module of ``posenc.encodings`` (helpers simply register nothing)."""
    package = importlib.import_module(_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{_PACKAGE}.{module.name}")


def _load_plugins() -> None:
    """Loads the ``posenc.encodings`` entry points, warning about each one that fails."""
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        label = f"{entry_point.name} = {entry_point.value}"
        try:
            loaded = entry_point.load()
            if inspect.isclass(loaded):
                register(loaded)
            elif not inspect.ismodule(loaded):
                raise TypeError(
                    f"it names a {type(loaded).__name__}, not a module or an Encoding subclass"
                )
        except Exception as err:  # a broken plugin must not break posenc
            _FAILED_PLUGINS[label] = f"{type(err).__name__}: {err}"
            warnings.warn(
                f"posenc could not load the encoder plugin {label!r} (entry point group "
                f"{ENTRY_POINT_GROUP!r}): {type(err).__name__}: {err}",
                RuntimeWarning,
                stacklevel=3,
            )


def _ensure_loaded() -> None:
    """Fills the registry from the package and the entry points, once per process."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # set first: a plugin that queries the registry while loading must not loop
    try:
        _import_package_modules()
    except BaseException:
        _loaded = False
        raise
    _load_plugins()


def names() -> tuple[str, ...]:
    """The registered encoder names, sorted."""
    _ensure_loaded()
    return tuple(sorted(_REGISTRY))


def get_class(name: str) -> type[Encoding]:
    """The encoder class registered as ``name``; a ``ValueError`` lists the known names."""
    _ensure_loaded()
    if name not in _REGISTRY:
        message = f"unknown encoding.name {name!r}; known encodings: {', '.join(names())}"
        if _FAILED_PLUGINS:
            message += f" (encoder plugins that failed to load: {', '.join(_FAILED_PLUGINS)})"
        raise ValueError(message)
    return _REGISTRY[name]


def hparam_names(name: str) -> tuple[str, ...]:
    """The hyperparameters encoder ``name`` accepts."""
    return tuple(f.name for f in dataclasses.fields(get_class(name)) if f.name != "dims")


def user_fields(message: str, hparams: Sequence[str]) -> str:
    """``message`` with each hyperparameter named as the user sets it: encoders phrase their
    checks as ``encoding.factor``, but the config field (and the command-line flag) is
    ``encoding.hparams.factor``."""
    if not hparams:
        return message
    names = "|".join(sorted(map(re.escape, hparams), key=len, reverse=True))
    return re.sub(rf"(?<![\w.])encoding\.({names})\b", r"encoding.hparams.\1", message)


@contextlib.contextmanager
def fields_as_set(name: str) -> Iterator[None]:
    """Re-raises a ``ValueError`` of encoder ``name``'s checks (its construction, binding,
    ``check_cacheable``) with its hyperparameters named as the user sets them
    (:func:`user_fields`); an error that names none passes through as it is."""
    try:
        yield
    except ValueError as e:
        message = user_fields(str(e), hparam_names(name))
        if message == str(e):
            raise
        raise ValueError(message) from None


def get(name: str, **hparams: Any) -> Encoding:
    """Creates the (unbound) encoder registered as ``name`` with the given hyperparameters.

    Raises:
      ValueError: for an unknown name (listing the known ones), an unknown hyperparameter
        (listing the accepted ones), or an invalid value (naming the field).
    """
    cls = get_class(name)
    allowed = hparam_names(name)
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(
            f"encoding {name!r} has no hyperparameter(s) {unknown}; "
            f"it accepts: {', '.join(allowed) or '(none)'}"
        )
    with fields_as_set(name):  # one line, naming the field as the user sets it
        return cls(**hparams)
