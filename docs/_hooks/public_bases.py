"""Griffe extension: a class's bases named by their public path in the reference.

A public class may derive from a class defined in a private module, re-exported by a
public one: ``durability.abc.Recorder`` derives from
``durability._contract.recorders.TurnRecorder``.
Griffe resolves a base to where it is defined. The reference's "Bases:" line would then
link to, and show on hover, the private path. This extension points each such base at
a public module that exports it. A name no public module exports is shown alone,
unlinked: a private base class, or a type variable in ``Generic[T]``.
``tests/test_docs_reference.py`` holds the built pages to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe


def is_private(path: str) -> bool:
    """Whether a dotted path has a part that starts with an underscore."""
    return any(part.startswith("_") for part in path.split("."))


def public_paths(package: griffe.Module) -> dict[str, str]:
    """Each privately defined object's path, mapped to the shortest public path of it."""
    found: dict[str, str] = {}
    for module in _modules(package):
        if is_private(module.path):
            continue
        for name, member in module.members.items():
            if name.startswith("_") or not isinstance(member, griffe.Alias):
                continue
            target = member.target_path
            public = f"{module.path}.{name}"
            if is_private(target) and len(public) < len(found.get(target, public + ".")):
                found[target] = public
    return found


def public_base(base: str | griffe.Expr, public: dict[str, str]) -> str | griffe.Expr:
    """``base`` with each name defined in a private module named publicly, or alone.

    The parts of a subscript (``Generic[T]``) and of a tuple are renamed in place."""
    if isinstance(base, griffe.ExprName):
        path = base.reference_path
        if path is None or not is_private(path):
            return base
        if path not in public:
            return griffe.ExprName(base.name)  # no scope: shown as text, not linked
        module, _, name = public[path].rpartition(".")
        return griffe.ExprName(name, parent=module)
    if isinstance(base, griffe.ExprSubscript):
        base.left = public_base(base.left, public)
        base.slice = public_base(base.slice, public)
    elif isinstance(base, griffe.ExprTuple):
        base.elements = [public_base(element, public) for element in base.elements]
    return base


class PublicBases(griffe.Extension):
    """Renames the bases of every class once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Point each base defined in a private module at a public module's export."""
        public = public_paths(pkg)
        for module in _modules(pkg):
            for member in module.members.values():
                if not member.is_alias and isinstance(member, griffe.Class):
                    member.bases = [public_base(base, public) for base in member.bases]


def _modules(module: griffe.Module) -> Iterator[griffe.Module]:
    yield module
    for submodule in module.modules.values():
        yield from _modules(submodule)
