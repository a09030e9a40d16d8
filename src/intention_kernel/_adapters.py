"""Pydantic adapters built at their first use, not when the package is imported.

Building a ``TypeAdapter`` generates and compiles its schema. The seven adapters of
the turn's records took about a third of ``import intention_kernel``. A CLI command or
a serverless start pays that every time. A process that runs turns builds them at its
first turn instead, once. After that first use, nothing is left of the indirection on
the hot path. A serializer's stand-in replaces itself in its module's namespace with
the real one. So each later call is the plain C serializer.

pydantic itself loads with the first adapter, not with the package: its import is
a fifth of a plain ``import intention_kernel``. A module that catches pydantic's
``ValidationError`` names it as ``_adapters.ValidationError``. An ``except``
clause reads that only when an exception comes, and pydantic raised it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import pydantic
    from pydantic import ValidationError

__all__ = ["LazyAdapter", "ValidationError", "first_use_serializer"]

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    """``ValidationError``, imported from pydantic when first read."""
    if name != "ValidationError":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pydantic import ValidationError

    globals()[name] = ValidationError
    return ValidationError


class LazyAdapter(Generic[T]):
    """A ``pydantic.TypeAdapter`` of ``type_``, built when first called for."""

    __slots__ = ("_adapter", "_type")

    def __init__(self, type_: type[T]) -> None:
        self._type = type_
        self._adapter: pydantic.TypeAdapter[T] | None = None

    def __call__(self) -> pydantic.TypeAdapter[T]:
        adapter = self._adapter
        if adapter is None:
            import pydantic

            # Two threads may both build it on their first turn; either adapter serves.
            adapter = self._adapter = pydantic.TypeAdapter(self._type)
        return adapter


def first_use_serializer(
    namespace: dict[str, Any], name: str, adapter: LazyAdapter[Any]
) -> Callable[..., bytes]:
    """A stand-in for ``adapter``'s ``serializer.to_json``, bound as ``namespace[name]``.

    Its first call builds the adapter and rebinds ``name`` to the real serializer. A
    module that imported the stand-in by name would keep calling it: still correct,
    one call slower. Only the module that owns ``name`` calls it.
    """

    def first(*args: Any, **kwargs: Any) -> bytes:
        serializer: Callable[..., bytes] = adapter().serializer.to_json
        namespace[name] = serializer
        return serializer(*args, **kwargs)

    return first
