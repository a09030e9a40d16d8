"""The API reference (docs/reference/): one page per public module, and a docstring
for every public name, so that the generated reference leaves nothing blank.

``mkdocs build --strict`` (``make docs-check``, part of ``make test``) then renders
each page; a docstring it cannot render fails the build.
"""

from __future__ import annotations

import re
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


def test_every_public_name_has_a_docstring() -> None:
    """Each name in a public module's ``__all__`` is documented where the reference
    renders it: a docstring, or a ``#:`` comment above a constant or an alias."""
    package = griffe.load(
        "intention_kernel",
        search_paths=[str(ROOT / "src")],
        extensions=griffe.load_extensions("griffe_sphinx"),
        resolve_aliases=True,
        resolve_external=False,
    )
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
