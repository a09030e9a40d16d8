"""The API reference (docs/reference/): one page per public module, and a docstring
for every public name, so that the generated reference leaves nothing blank.

``mkdocs build --strict`` (``make docs-check``, part of ``make test``) then renders
each page; a docstring it cannot render fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import griffe

from docs_support import ROOT

#: The public modules: each has one page in docs/reference/ (``::: module``).
PUBLIC_MODULES = (
    "intention_kernel",
    "intention_kernel.errors",
    "intention_kernel.durability",
    "intention_kernel.durability.sqlite",
    "intention_kernel.durability.postgres",
    "intention_kernel.durability.abc",
    "intention_kernel.testing",
    "intention_kernel.testing.conformance",
    "intention_kernel.testing.sqlite",
    "intention_kernel.testing.faults",
    "intention_kernel.interpreters.openai",
    "intention_kernel.integrations.mcp",
    "intention_kernel.integrations.pydantic_ai",
    "intention_kernel.integrations.openai_agents",
    "intention_kernel.host",
    "intention_kernel.outbox",
    "intention_kernel.operations",
)


def reference_pages() -> dict[str, Path]:
    """The module each reference page documents, by module name."""
    pages = {}
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        found = re.findall(r"^::: (\S+)$", page.read_text(encoding="utf-8"), re.M)
        pages.update(dict.fromkeys(found, page))
    return pages


def test_every_public_module_has_a_reference_page_of_its_own() -> None:
    pages = reference_pages()
    assert sorted(pages) == sorted(PUBLIC_MODULES)
    assert len(set(pages.values())) == len(pages), "one page per public module"


def load_package() -> griffe.Module:
    """The package as the reference sees it: ``#:`` comments are docstrings too."""
    package = griffe.load(
        "intention_kernel",
        search_paths=[str(ROOT / "src")],
        extensions=griffe.load_extensions("griffe_sphinx"),
        resolve_aliases=True,
        resolve_external=False,
    )
    assert isinstance(package, griffe.Module)
    return package


def test_every_public_name_has_a_docstring() -> None:
    """Each name in a public module's ``__all__`` is documented where the reference
    renders it: a docstring, or a ``#:`` comment above a constant or an alias."""
    package = load_package()
    missing = []
    for name in PUBLIC_MODULES:
        module = package if name == "intention_kernel" else package[name.partition(".")[2]]
        assert module.docstring is not None, f"{name} has no module docstring"
        assert module.exports is not None, f"{name} has no __all__"
        for export in module.exports:
            target = module[str(export)]
            target = target.final_target if target.is_alias else target
            if target.docstring is None or not target.docstring.value.strip():
                missing.append(f"{name}.{export}")
    assert missing == [], "public names without a docstring"


def test_every_public_method_has_a_docstring() -> None:
    """Each public method of a public class is documented. A conformance test's
    name states its rule, and a fixture is described by its case."""
    package = load_package()
    undocumented = set()
    for name in PUBLIC_MODULES:
        module = package if name == "intention_kernel" else package[name.partition(".")[2]]
        for export in module.exports or ():
            cls = module[str(export)]
            cls = cls.final_target if cls.is_alias else cls
            if not cls.is_class:
                continue
            for member_name, member in cls.members.items():
                if member_name.startswith(("_", "test_")) or member.is_alias:
                    continue
                fixture = any("fixture" in str(d.value) for d in getattr(member, "decorators", []))
                if member.is_function and not fixture and member.docstring is None:
                    undocumented.add(f"{export}.{member_name}")
    assert sorted(undocumented) == [], "public methods without a docstring"


def test_sphinx_roles_read_as_code_spans_in_the_reference() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        from sphinx_roles import plain
    finally:
        sys.path.remove(str(ROOT / "docs" / "_hooks"))
    text = "Uses :class:`~a.b.Kernel`, :func:`.open_durability` and :mod:`x.y`::\n\n    code"
    assert plain(text) == "Uses `Kernel`, `open_durability` and `x.y`:\n\n    code"
    assert plain("a literal `::` inside a sentence :: stays") == (
        "a literal `::` inside a sentence :: stays"
    )
