"""The code blocks of README.md and docs/, parsed for Sybil and run as the reader would.

Each Markdown document is one Sybil document with one namespace, so its blocks run in
order and share names, as a reader pasting them one after another would. The rules:

- A ```` ```python ```` block runs. Top-level ``await`` is allowed: such a block runs on
  the document's own event loop. ``__name__`` is ``"__main__"`` and ``sys.argv`` holds
  only the document, so a script's ``if __name__ == "__main__":`` part runs too.
- A block whose only line is ``--8<-- "path"`` is that file of the repository, as the
  site shows it (pymdownx.snippets); the file runs.
- A python (or pycon) block that starts with ``>>>`` is a session: it runs as a
  doctest, and each output it shows is compared (``...`` matches anything).
- A ```` ```text ```` block right after a python block (blank lines and one lead-in line
  such as "It prints:" between them) is that block's output, compared exactly.
- A ```` ```sh ```` block is not run: every command it names must exist (a make target,
  a module or script, an extra, an ``intention-kernel`` command and its options). In a
  ```` ```console ```` block, the commands are the lines after a ``$`` prompt.
- A json, toml, yaml or ini block must parse.
- ``<!-- docs: skip (reason) -->`` right before a fence: the block is not run, and the
  reason is required. ``<!-- docs: file NAME -->``: the block is written to ``NAME`` in
  the document's working directory (a temporary one) instead of being run.
- ``<!-- docs: run``, a line break, Python, then ``-->``: hidden setup that runs in the
  namespace but does not show on the page (what a fragment needs from its page).
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import contextlib
import difflib
import doctest
import importlib.util
import inspect
import io
import json
import os
import re
import shlex
import textwrap
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sybil import Document, Example, Region, Sybil

ROOT = Path(__file__).resolve().parents[1]

#: A fenced block, possibly indented (inside a list item).
FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$",
    re.M | re.S,
)
#: A directive for the fence that follows it, or hidden setup code.
DIRECTIVE = re.compile(r"<!--\s*docs:\s*(?P<kind>[\w-]+)(?P<rest>.*?)-->", re.S)
SNIPPET = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')
#: Tools a shell block may name that the repository does not provide.
SYSTEM_TOOLS = frozenset({"curl", "kill", "cd"})


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its text (dedented) and where it starts."""

    lang: str
    body: str
    line: int


def documents() -> list[Path]:
    """Every Markdown document whose blocks the tests run."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [path for path in found if "_hooks" not in path.parts]


def parse_blocks(document: Document) -> Iterator[Region]:
    """Sybil parser: a region per fenced block and per hidden setup comment."""
    text = document.text
    events: list[tuple[int, int, str, re.Match[str]]] = []
    for match in FENCE.finditer(text):
        events.append((match.start(), match.end(), "fence", match))
    for match in DIRECTIVE.finditer(text):
        if match["kind"] == "run" and match["rest"].startswith("\n"):
            events.append((match.start(), match.end(), "run", match))
    events.sort(key=lambda event: event[0])
    previous_end = 0
    previous_python = False
    for start, end, what, match in events:
        if start < previous_end:
            raise ValueError(f"{document.path}: a docs comment overlaps a code block")
        gap = text[previous_end:start]
        line = text.count("\n", 0, start) + 1
        if what == "run":
            block = Block("python", textwrap.dedent(match["rest"]).strip("\n") + "\n", line + 1)
            yield Region(start, end, block, run_python)
            previous_end, previous_python = end, False  # hidden: its output is not shown
            continue
        lang = match["lang"]
        body = _dedent(match["body"], match["indent"])
        block = Block(lang, body, line + 1)
        directive = _directive_before(gap)
        if directive is not None:
            kind, rest = directive
            if kind == "skip":
                if not rest.strip(" ()"):
                    raise ValueError(f"{document.path}:{line}: docs: skip needs a reason")
                yield Region(start, end, block, None)
            elif kind == "file":
                yield Region(start, end, (block, rest.strip()), write_file)
            else:
                raise ValueError(f"{document.path}:{line}: unknown directive docs: {kind}")
            previous_python = False
        elif lang in ("python", "pycon") and block.body.lstrip().startswith(">>>"):
            yield Region(start, end, block, run_doctest)
            previous_python = False  # a session shows its own output
        elif lang == "python":
            yield Region(start, end, block, run_python)
            previous_python = True
        elif lang == "text":
            if previous_python and _is_lead_in(gap):
                yield Region(start, end, block, compare_output)
            previous_python = False
        elif lang in ("sh", "bash", "console"):
            yield Region(start, end, block, check_shell)
            previous_python = False
        elif lang in DATA_LANGUAGES:
            yield Region(start, end, block, check_data)
            previous_python = False
        else:
            raise ValueError(
                f"{document.path}:{line}: a ```{lang} block: use python, text, sh, console or"
                f" one of {sorted(DATA_LANGUAGES)}, or mark it with <!-- docs: skip (reason) -->"
            )
        previous_end = end


def _dedent(body: str, indent: str) -> str:
    lines = body.split("\n")
    return "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines)


def _directive_before(gap: str) -> tuple[str, str] | None:
    """The ``docs:`` comment that ends the text before a fence, if one does."""
    stripped = gap.rstrip()
    if not stripped.endswith("-->"):
        return None
    found = list(DIRECTIVE.finditer(stripped))
    if not found or found[-1].end() != len(stripped) or found[-1]["kind"] == "run":
        return None
    return found[-1]["kind"], found[-1]["rest"]


def _is_lead_in(gap: str) -> bool:
    """Only blank lines, or one short line ending with a colon, between two blocks."""
    lines = [line for line in gap.split("\n") if line.strip()]
    return not lines or (len(lines) == 1 and lines[0].rstrip().endswith(":"))


def source_of(block: Block) -> str:
    """The block's Python: itself, or the repository file it includes."""
    snippet = SNIPPET.match(block.body.strip())
    if snippet is None:
        return block.body
    return (ROOT / snippet["path"]).read_text(encoding="utf-8")


def run_python(example: Example) -> str | None:
    """Run the block in the document's namespace, keeping what it printed."""
    block: Block = example.parsed
    namespace = example.namespace
    source = source_of(block)
    offset = 0 if source is not block.body else block.line - 1
    code = compile(
        "\n" * offset + source,
        str(example.path),
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        if code.co_flags & inspect.CO_COROUTINE:
            runner: asyncio.Runner = namespace["__docs_runner__"]
            runner.run(eval(code, namespace))
        else:
            exec(code, namespace)
    namespace["__docs_stdout__"] = printed.getvalue()
    return None


def run_doctest(example: Example) -> str | None:
    """A ``>>>`` session: each statement runs, and what it prints must match."""
    block: Block = example.parsed
    test = doctest.DocTestParser().get_doctest(
        block.body, example.namespace, str(example.path), str(example.path), block.line - 1
    )
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    runner.run(test, out=report.write, clear_globs=False)
    return report.getvalue() if runner.failures else None


def compare_output(example: Example) -> str | None:
    """The text block must be exactly what the python block before it printed."""
    expected: str = example.parsed.body
    printed: str = example.namespace.get("__docs_stdout__", "")
    if printed == expected:
        return None
    diff = difflib.unified_diff(
        expected.splitlines(), printed.splitlines(), "shown", "printed", lineterm=""
    )
    return "the block printed something else than the page shows:\n" + "\n".join(diff)


def write_file(example: Example) -> str | None:
    """Save the block under its name in the document's working directory."""
    block, name = example.parsed
    Path(name).write_text(block.body, encoding="utf-8")
    return None


def check_data(example: Example) -> str | None:
    """A configuration or data block parses in its language."""
    block: Block = example.parsed
    try:
        DATA_LANGUAGES[block.lang](block.body)
    except Exception as exc:
        return f"this {block.lang} block does not parse: {exc}"
    return None


def _ini(text: str) -> None:
    configparser.ConfigParser().read_string(text)


def _yaml(text: str) -> None:
    # PyYAML comes with mkdocs; imported by name, as its stubs are not installed.
    importlib.import_module("yaml").safe_load(text)


#: Languages of blocks that are data, not programs: each must parse.
DATA_LANGUAGES: dict[str, Callable[[str], object]] = {
    "json": json.loads,
    "toml": tomllib.loads,
    "yaml": _yaml,
    "ini": _ini,
}


def check_shell(example: Example) -> str | None:
    """Every command the block names exists, with the options it gives."""
    block: Block = example.parsed
    problems = [problem for command in shell_commands(block.body) for problem in check(command)]
    return "\n".join(problems) or None


def shell_commands(body: str) -> list[list[str]]:
    """The block's commands as words: continuations joined, comments and ``&`` dropped.
    In a console session, only the lines after a ``$`` prompt are commands."""
    if any(line.startswith("$ ") for line in body.split("\n")):
        body = "\n".join(line[2:] for line in body.split("\n") if line.startswith("$ "))
    joined = body.replace("\\\n", " ")
    commands: list[list[str]] = []
    for line in joined.split("\n"):
        for words in _split_on_operators(shlex.split(line, comments=True)):
            commands += [words] if words else []
    return [_without_prefix(words) for words in commands if _without_prefix(words)]


def _split_on_operators(words: list[str]) -> list[list[str]]:
    """``a && b; c | d`` as the three commands it runs."""
    parts: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "||", ";", "|"):
            parts.append([])
        else:
            parts[-1].append(word)
    return parts


def _without_prefix(words: list[str]) -> list[str]:
    """The command itself: no ``VAR=value`` before it, no ``&`` after it."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]
    if words and words[-1] == "&":
        words = words[:-1]
    return words


def check(words: list[str]) -> list[str]:
    """What is wrong with one command, if anything."""
    tool = Path(words[0]).name if words[0].startswith(".venv/bin/") else words[0]
    args = words[1:]
    if tool == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
        return [f"make: no target {name!r}" for name in args if name not in targets]
    if tool in ("python", "python3"):
        return _check_python(args)
    if tool == "pip":
        return _check_pip(args)
    if tool == "pytest":
        paths = [arg.split("::")[0] for arg in args if arg.endswith(".py") or "::" in arg]
        return [f"pytest: no file {path}" for path in paths if not (ROOT / path).exists()]
    if tool == "intention-kernel":
        return _check_cli(args)
    if tool == "export":
        bad = [a for a in args if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", a)]
        return [f"export: not VAR=value: {a}" for a in bad]
    if tool.startswith("scripts/"):
        # A script of the repository's: it exists and may be run.
        script = ROOT / tool
        return [] if os.access(script, os.X_OK) else [f"{tool}: no such executable script"]
    if tool in SYSTEM_TOOLS:
        return []
    return [f"{words[0]}: not a command the docs know (add it to SYSTEM_TOOLS if it is one)"]


def _check_python(args: list[str]) -> list[str]:
    if args[:1] == ["-m"]:
        module = args[1]
        found = importlib.util.find_spec(module) is not None
        return [] if found else [f"python -m {module}: no such module"]
    if args and args[0].endswith(".py"):
        return [] if (ROOT / args[0]).exists() else [f"python {args[0]}: no such file"]
    return [f"python {' '.join(args)}: name a module (-m) or a script"]


def _check_pip(args: list[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    wanted = [
        extra.strip()
        for arg in args
        for group in re.findall(r"\[([\w,-]+)\]", arg)
        for extra in group.split(",")
    ]
    return [f"pip: no extra {extra!r} in pyproject.toml" for extra in wanted if extra not in extras]


def _check_cli(args: list[str]) -> list[str]:
    import typer
    import typer.main

    from intention_kernel.cli._app import app

    command: Any = typer.main.get_command(app)
    path = ["intention-kernel"]
    rest = list(args)
    while hasattr(command, "list_commands") and rest and not rest[0].startswith("-"):
        ctx = typer.Context(command, info_name=" ".join(path))
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return [f"{' '.join(path)}: no command {rest[0]!r}"]
        command, path, rest = sub, [*path, rest.pop(0)], rest
    ctx = typer.Context(command, info_name=" ".join(path))
    options = {
        name
        for param in command.get_params(ctx)
        for name in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
    }
    given = [arg.split("=", 1)[0] for arg in rest if arg.startswith("--")]
    return [f"{' '.join(path)}: no option {name}" for name in given if name not in options]


def sybil() -> Sybil:
    """The Sybil that parses the docs (documents are set up by the test that runs them)."""
    return Sybil(parsers=[parse_blocks], patterns=["*.md"])
