#!/usr/bin/env python3
"""How long the sentences of comments and docstrings are, per file and in total.

A tool for authors, not a test: the house style asks for one claim per sentence.
That means 9 to 12 words per sentence on average, and none over 40 words.

    python scripts/sentences.py                    # src/, sentences over 40 words
    python scripts/sentences.py src/pkg/a.py --over 30 --top 10

The text read is every comment and every docstring (module, class, function).
Code inside a docstring is skipped: indented blocks, ``>>>`` lines and fences.
URLs and directives such as ``# noqa`` or ``# type: ignore`` are skipped too.
A sentence ends at ``.``, ``!`` or ``?`` before a space, at a blank line,
at a list item, and where its comment block or docstring ends.
"e.g.", "i.e." and dotted names such as ``a.b.c`` do not end one.
Only the standard library is used (``ast`` and ``tokenize``).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: A line of text and the line of the file it came from.
Line = tuple[int, str]

_URL = re.compile(r"<?https?://\S+>?|`[^`]*<https?://[^>]*>`_")
_DIRECTIVE = re.compile(r"^\s*(noqa|type:|pragma|mypy:|ruff:|fmt:|pyright:|isort:|!)")
_ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|etc|vs|cf|approx|resp)\.", re.IGNORECASE)
_END = re.compile(r"[.!?]+[\"')\]`*]*(?=\s)")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_FENCE = re.compile(r"^\s*(```|~~~)")
_WORD = re.compile(r"\w")
_PLACEHOLDER = "\x00"


@dataclass
class Sentence:
    """One sentence: where it starts, its words, and its text."""

    path: str
    line: int
    words: int
    text: str


@dataclass
class FileFigures:
    """The sentences of one file."""

    path: str
    sentences: list[Sentence] = field(default_factory=list)

    @property
    def words(self) -> int:
        """Words in all of the file's sentences."""
        return sum(s.words for s in self.sentences)

    @property
    def average(self) -> float:
        """Words per sentence, or 0 when the file has none."""
        return self.words / len(self.sentences) if self.sentences else 0.0


def comment_blocks(source: str) -> Iterator[list[Line]]:
    """The file's comments, consecutive full-line comments joined into one block.

    A comment after code on its line is a block of its own.
    """
    block: list[Line] = []
    last = -1
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        row, col = token.start
        text = token.string.lstrip("#")
        text = text[1:] if text.startswith(":") else text  # Sphinx's "#:" doc comments
        if row == 1 and token.string.startswith("#!"):
            continue
        if _DIRECTIVE.match(text):
            continue
        alone = token.line[:col].strip() == ""
        if block and alone and row == last + 1:
            block.append((row, text))
        else:
            if block:
                yield block
            block = [(row, text)]
            if not alone:
                yield block
                block = []
        last = row
    if block:
        yield block


def docstrings(tree: ast.AST) -> Iterator[list[Line]]:
    """The module's, classes' and functions' docstrings, without the code they show."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if not node.body:
            continue
        first = node.body[0]
        if not (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            continue
        raw = first.value.value
        lines = raw.expandtabs().split("\n")
        indent = min(
            (len(x) - len(x.lstrip()) for x in lines[1:] if x.strip()),
            default=0,
        )
        cleaned = [lines[0].strip()] + [x[indent:] for x in lines[1:]]
        yield _prose(first.lineno, cleaned)


def _prose(start: int, lines: list[str]) -> list[Line]:
    """The lines of a docstring that are prose: code blocks become blank lines."""
    kept: list[Line] = []
    fenced = False
    literal = False  # inside an indented block, such as one after "::"
    for offset, text in enumerate(lines):
        row = start + offset
        if _FENCE.match(text):
            fenced = not fenced
            kept.append((row, ""))
            continue
        stripped = text.strip()
        indented = text[:1].isspace() and stripped != ""
        if fenced or stripped.startswith((">>>", "... ")) or stripped == "...":
            kept.append((row, ""))
            continue
        if indented and (literal or not _continues_item(kept)):
            literal = True
            kept.append((row, ""))
            continue
        if stripped:
            literal = False
        kept.append((row, text))
    return kept


def _continues_item(kept: list[Line]) -> bool:
    """Whether an indented line goes on with the list item or field just above it."""
    for _, text in reversed(kept):
        if not text.strip():
            return False
        if _BULLET.match(text) or re.match(r"^\s*:\w[^:]*:", text):
            return True
        if not text[:1].isspace():
            return False
    return False


def sentences(path: str, block: list[Line]) -> Iterator[Sentence]:
    """The sentences of one comment block or docstring."""
    text = ""
    rows: list[int] = []  # the file line of each character of ``text``

    def add(piece: str, row: int) -> None:
        nonlocal text
        text += piece
        rows.extend([row] * len(piece))

    for row, line in block:
        line = _URL.sub("URL", line)
        line = _ABBREVIATIONS.sub(lambda m: m.group(1) + _PLACEHOLDER, line)
        if not line.strip():
            add("\n\n", row)  # a paragraph ends a sentence
        elif _BULLET.match(line):
            add("\n\n" + line.strip() + " ", row)  # so does a list item
        else:
            add(line.strip() + " ", row)
    start = 0
    for piece in re.split(r"(\n\n)", text):
        yield from _split(path, piece, rows, start)
        start += len(piece)


def _split(path: str, paragraph: str, rows: list[int], start: int) -> Iterator[Sentence]:
    """The sentences of one paragraph, ``start`` being its offset in the block."""
    begin = 0
    for match in _END.finditer(paragraph):
        yield from _sentence(path, paragraph[begin : match.end()], rows, start + begin)
        begin = match.end()
    yield from _sentence(path, paragraph[begin:], rows, start + begin)


def _sentence(path: str, text: str, rows: list[int], offset: int) -> Iterator[Sentence]:
    words = [w for w in text.split() if _WORD.search(w)]
    if not words:
        return
    lead = len(text) - len(text.lstrip())
    line = rows[min(offset + lead, len(rows) - 1)]
    shown = " ".join(text.replace(_PLACEHOLDER, ".").split())
    yield Sentence(path, line, len(words), shown)


def measure(path: Path) -> FileFigures:
    """The sentences of one Python file's comments and docstrings."""
    source = path.read_text(encoding="utf-8")
    figures = FileFigures(str(path))
    blocks = list(comment_blocks(source)) + list(docstrings(ast.parse(source)))
    for block in blocks:
        figures.sentences.extend(sentences(str(path), block))
    figures.sentences.sort(key=lambda s: s.line)
    return figures


def python_files(paths: list[str]) -> Iterator[Path]:
    """Each ``.py`` file named, or found under a folder named, in sorted order."""
    for name in paths:
        path = Path(name)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if ".venv" not in p.parts)
        elif path.suffix == ".py":
            yield path


def main(argv: list[str] | None = None) -> int:
    """Print the figures; always exits 0, since this is a report and not a gate."""
    parser = argparse.ArgumentParser(
        description="Words per sentence of comments and docstrings.",
    )
    parser.add_argument("paths", nargs="*", default=["src"], help="files or folders")
    parser.add_argument(
        "--over",
        type=int,
        default=40,
        metavar="N",
        help="list every sentence of more than N words (default 40)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=None,
        metavar="N",
        help="show only the N files with the longest average sentences",
    )
    args = parser.parse_args(argv)
    files = [measure(p) for p in python_files(args.paths)]
    files = [f for f in files if f.sentences]
    shown = sorted(files, key=lambda f: f.average, reverse=True)
    if args.top is not None:
        shown = shown[: args.top]
    over = [s for f in files for s in f.sentences if s.words > args.over]
    print(f"{'words/sentence':>14}  {'sentences':>9}  {'over':>4}  file")
    for f in shown:
        long = sum(1 for s in f.sentences if s.words > args.over)
        print(f"{f.average:14.1f}  {len(f.sentences):9d}  {long:4d}  {f.path}")
    every = [s for f in files for s in f.sentences]
    total = sum(s.words for s in every)
    average = total / len(every) if every else 0.0
    share = 100 * len(over) / len(every) if every else 0.0
    print(
        f"{average:14.1f}  {len(every):9d}  {len(over):4d}  "
        f"total of {len(files)} files ({share:.1f}% over {args.over} words)"
    )
    if over:
        print(f"\nSentences over {args.over} words:")
        for s in over:
            print(f"{s.path}:{s.line}: {s.words} words: {s.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
