"""The API reference (docs/reference/): one page per public module, and a docstring
for every public name, so that the generated reference leaves nothing blank.

A module is public when no part of its dotted path starts with an underscore, as in
httpx: everything else is internal, and a user imports it from a public module.

``mkdocs build --strict`` (``make docs``, part of ``make test``) then renders
each page; a docstring it cannot render fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import griffe
import pytest

from docs_support import ROOT

SRC = ROOT / "src"

#: The command line's page is generated from ``--help`` (docs/_hooks/cli_reference.py):
#: this marker makes it the page of ``intention_kernel.cli``, the entry point's module.
CLI_PAGE_MARKER = "<!-- cli-reference -->"


def public_modules() -> list[str]:
    """Every module of the package whose dotted path has no underscore part."""
    found = []
    for path in sorted((SRC / "intention_kernel").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__" or any(part.startswith("_") for part in parts):
            continue
        found.append(".".join(parts))
    return found


#: The public modules: each has one page in docs/reference/ (``::: module``).
PUBLIC_MODULES = tuple(public_modules())


def reference_pages() -> dict[str, Path]:
    """The module each reference page documents, by module name."""
    pages = {}
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        found = re.findall(r"^::: (\S+)$", text, re.M)
        if CLI_PAGE_MARKER in text:
            found.append("intention_kernel.cli")
        pages.update(dict.fromkeys(found, page))
    return pages


def test_the_public_modules_are_the_facade_and_the_modules_users_import() -> None:
    """The surface is chosen, not grown: a new module without an underscore must be
    added here on purpose, with its reference page."""
    assert sorted(PUBLIC_MODULES) == [
        "intention_kernel",
        "intention_kernel.cli",
        "intention_kernel.durability",
        "intention_kernel.durability.abc",
        "intention_kernel.durability.postgres",
        "intention_kernel.durability.sqlite",
        "intention_kernel.errors",
        "intention_kernel.host",
        "intention_kernel.integrations",
        "intention_kernel.integrations.langgraph",
        "intention_kernel.integrations.mcp",
        "intention_kernel.integrations.openai_agents",
        "intention_kernel.integrations.pydantic_ai",
        "intention_kernel.interpreters",
        "intention_kernel.interpreters.openai",
        "intention_kernel.operations",
        "intention_kernel.outbox",
        "intention_kernel.testing",
        "intention_kernel.testing.conformance",
        "intention_kernel.testing.faults",
        "intention_kernel.testing.sqlite",
    ]


def test_every_public_module_has_a_reference_page_of_its_own() -> None:
    """Each public module has its page, and each page is a public module's."""
    pages = reference_pages()
    assert sorted(pages) == sorted(PUBLIC_MODULES)
    assert len(set(pages.values())) == len(pages), "one page per public module"


#: An import, or a dotted path, that names a private module of the package.
PRIVATE_PATH = re.compile(
    r"\bintention_kernel(?:\.\w+)*\._(?!_)\w*|from intention_kernel\S* import _"
)


def test_the_guides_and_examples_import_only_public_modules() -> None:
    """What a reader copies (the docs' code and the examples) uses the public surface;
    the demo agent's ``--agent`` spec is prose naming a module, not an import."""
    found = []
    sources = [*(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("*.py")]
    for path in sorted(sources):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.strip()
            if code.startswith(("from ", "import ")) and PRIVATE_PATH.search(code):
                found.append(f"{path.relative_to(ROOT)}:{number}: {code}")
    assert found == []


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


#: The modules whose page renders their docstrings (the CLI's page is its ``--help``).
DOCSTRING_MODULES = tuple(m for m in PUBLIC_MODULES if m != "intention_kernel.cli")


def test_every_public_name_has_a_docstring() -> None:
    """Each name in a public module's ``__all__`` is documented where the reference
    renders it: a docstring, or a ``#:`` comment above a constant or an alias."""
    package = load_package()
    missing = []
    for name in DOCSTRING_MODULES:
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
    for name in DOCSTRING_MODULES:
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


def _public_bases_extension() -> griffe.Extension:
    """The extension mkdocs.yml names, which renames bases defined in private modules."""
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        from public_bases import PublicBases
    finally:
        sys.path.remove(str(ROOT / "docs" / "_hooks"))
    extension: griffe.Extension = PublicBases()
    return extension


def bases_with_private_paths(package: griffe.Module) -> list[str]:
    """Each base, or name inside one, of a public class that links to a private path."""
    found = []
    for name in DOCSTRING_MODULES:
        module = package if name == "intention_kernel" else package[name.partition(".")[2]]
        for export in module.exports or ():
            cls = module[str(export)]
            cls = cls.final_target if cls.is_alias else cls
            if not isinstance(cls, griffe.Class):
                continue
            for base in cls.bases:
                parts = base.iterate(flat=True) if isinstance(base, griffe.Expr) else ()
                for part in parts:
                    path = part.reference_path if isinstance(part, griffe.ExprName) else None
                    if path is not None and PRIVATE_PART.search(path):
                        found.append(f"{name}.{export}: {path}")
    return found


#: A dotted path's part that names a private module or object.
PRIVATE_PART = re.compile(r"(^|\.)_[A-Za-z0-9]")


def test_the_bases_of_public_classes_name_no_private_module() -> None:
    """The reference's "Bases:" line links each base by a public path, or shows its
    name alone. A base defined in ``durability._contract.recorders`` is linked by
    ``durability.abc``, which exports it."""
    package = griffe.load(
        "intention_kernel",
        search_paths=[str(ROOT / "src")],
        extensions=griffe.load_extensions("griffe_sphinx", _public_bases_extension()),
        resolve_aliases=True,
        resolve_external=False,
    )
    assert isinstance(package, griffe.Module)
    assert bases_with_private_paths(package) == []


def test_no_built_reference_page_shows_a_private_path_in_a_bases_line() -> None:
    """The pages ``make docs`` built (``make test`` builds them before the tests run)."""
    site = ROOT / "build" / "site" / "reference"
    if not site.is_dir():
        pytest.skip("no built site: make docs builds it into build/site")
    found = []
    for page in sorted(site.rglob("*.html")):
        for line in re.findall(r"Bases:(.*?)</p>", page.read_text(encoding="utf-8"), re.S):
            for path in re.findall(r'(?:title|href)="([^"]*)"', line):
                if re.search(r"\._", path):
                    found.append(f"{page.relative_to(site)}: {path}")
            if re.search(r"\._", re.sub(r"<[^>]+>", "", line)):
                found.append(f"{page.relative_to(site)}: {line.strip()}")
    assert found == []
