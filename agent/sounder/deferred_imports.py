"""Standard-library modules the sounder's libraries import but its alarm path never uses: each
is loaded the first time something reads from it, not when it is imported.

paho imports `urllib.request` at its top for one thing, the proxy settings of a PySocks install
(not a dependency of the agent), and with it `http.client`, `email` and 20 more modules: ~10 ms of
the sounder's CPU before an alarm plays (docs/measurements.md, "From power-on"). A deferred
module is the real module object, created from its real spec; the first attribute it lacks
loads the module's code into it, under a lock, and from then on it is a plain module: nothing
behaves differently, it only loads later (or never). Not `importlib.util.LazyLoader`: on
Python 3.11 the import statement's own look at `__spec__` loads such a module at once.

Only the sounder defers (`voice-agent run`, before it imports its libraries); the engine, which
fetches URLs from several threads, imports everything as usual.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from typing import Final

DEFERRED: Final = ("urllib.request",)
"""What the sounder loads only when something reads from it."""
_LOADING = threading.RLock()


class _Deferred(types.ModuleType):
    """A module imported but not executed yet."""

    def __getattr__(self, name: str) -> object:
        """Only for an attribute the module does not have: load it, then look again."""
        with _LOADING:
            if type(self) is _Deferred:
                loader = None if self.__spec__ is None else self.__spec__.loader
                if loader is None:  # not one `defer` made
                    raise AttributeError(name)
                loader.exec_module(self)
                self.__class__ = types.ModuleType  # type: ignore[assignment]
        return getattr(self, name)


def defer(names: tuple[str, ...] = DEFERRED) -> list[str]:
    """Import each of `names` that is not imported yet without running its code (it runs at
    the first read of an attribute it lacks); the names deferred."""
    deferred: list[str] = []
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _Deferred
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:  # `import urllib.request` reads it as an attribute of `urllib`
            setattr(sys.modules[parent], child, module)
        deferred.append(name)
    return deferred
