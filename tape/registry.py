"""Plugin registries: a package whose modules each register one class under a name on import
(the encodings in tape/pe, the tasks in pipelines/tasks)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")
C = TypeVar("C", bound=type)


class Registry(Generic[T]):
    """Name -> entry for the modules of ``package``; an entry is the registered class, or one
    instance of it when ``instances`` is true. Modules named ``base`` or ``_*`` hold no entry."""

    def __init__(self, package: str, kind: str, instances: bool = False) -> None:
        self.package, self.kind, self.instances = package, kind, instances
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: set ``cls.name`` and make the class available as ``name``."""

        def deco(cls: C) -> C:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cls.name = name
            self._entries[name] = cls() if self.instances else cls
            return cls

        return deco

    def modules(self) -> list[str]:
        """Names of the package's modules that register an entry."""
        paths = importlib.import_module(self.package).__path__
        return [m.name for m in pkgutil.iter_modules(paths) if m.name != "base" and not m.name.startswith("_")]

    def import_all(self) -> None:
        """Import every module of the package (each registers itself)."""
        for module in self.modules():
            importlib.import_module(f"{self.package}.{module}")

    def load(self, name: str) -> None:
        """Import the module named ``name`` if there is one, else every module."""
        if name in self._entries:
            return
        if name in self.modules():
            importlib.import_module(f"{self.package}.{name}")
        else:
            self.import_all()

    def find(self, name: str) -> T | None:
        """The entry registered as ``name`` among the modules imported so far (None: none)."""
        return self._entries.get(name)

    def names(self) -> list[str]:
        """Sorted names registered so far."""
        return sorted(self._entries)

    def __contains__(self, name: Any) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._entries.values()))
