"""Griffe extension: the docstrings' Sphinx markup, as the Markdown reference shows it.

The docstrings are written for Sphinx readers: ``:class:`Kernel```, a paragraph that
ends with ``::`` before an indented example. Markdown would print both literally. A
role becomes a code span of its target, shortened as Sphinx shows it (``~a.b.C`` is
``C``; ``.c`` is ``c``). A paragraph's closing ``::`` becomes one colon; the indented
block after it is already a code block in Markdown.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")
LITERAL_MARKER = re.compile(r"(?<=\S)::$", re.M)


def plain(text: str) -> str:
    """``text`` with every role as a code span and every ``::`` as a colon."""
    return LITERAL_MARKER.sub(":", ROLE.sub(_code_span, text))


def _code_span(match: re.Match[str]) -> str:
    target = match["target"].strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target.lstrip('.')}`"


class SphinxRoles(griffe.Extension):
    """Rewrites each docstring once, as its object is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of a module, class, function or attribute."""
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
