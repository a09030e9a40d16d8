"""README.md and the site in docs/: every code block runs as the page shows it, and the
API reference documents every public name.

The rules for code blocks (what runs, what is compared, how a block is skipped) are in
``docs_support``'s docstring. ``mkdocs build --strict`` (``make docs``, part of
``make test``) checks links, anchors and the rendering of every docstring.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from sybil import Document

from docs_support import ROOT, documents, sybil


def run_document(path: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block of ``path`` in order, in one namespace, from ``cwd``."""
    document = sybil().parse(path)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [str(path)])
    # An OpenAI client needs a key to be built; the docs never call a model.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-docs-offline")
    with asyncio.Runner() as runner:
        document.namespace.update(__name__="__main__", __docs_runner__=runner)
        for example in document.examples():
            example.evaluate()


@pytest.mark.parametrize("path", documents(), ids=[str(p.relative_to(ROOT)) for p in documents()])
def test_every_code_block_runs_as_the_page_shows_it(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_document(path, tmp_path, monkeypatch)


def test_the_readmes_links_name_files_and_headings_that_exist() -> None:
    """The README is read on the forge, outside the site's strict build: its links to
    files and to headings of the site's pages are checked here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]*))?\)", readme)
    local = [(target, anchor) for target, anchor in links if "://" not in target]
    assert local, "the README links to the site's pages"
    assert [target for target, _ in local if not (ROOT / target).exists()] == []
    broken = [
        f"{target}#{anchor}"
        for target, anchor in local
        if anchor and anchor not in heading_slugs(ROOT / target)
    ]
    assert broken == []


def heading_slugs(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as the site and the forge make them."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}


# The harness itself: each rule fails a page that breaks it.


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_output_that_differs_from_the_page_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = page(tmp_path, "```python\nprint('a')\n```\n\nIt prints:\n\n```text\nb\n```\n")
    with pytest.raises(Exception, match="printed something else"):
        run_document(wrong, tmp_path, monkeypatch)
    right = page(tmp_path, "```python\nprint('a')\n```\n\nIt prints:\n\n```text\na\n```\n")
    run_document(right, tmp_path, monkeypatch)


def test_a_python_block_that_raises_fails_and_top_level_await_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    awaited = "```python\nimport asyncio\nawait asyncio.sleep(0)\nprint('ok')\n```\n"
    run_document(page(tmp_path, awaited + "```text\nok\n```\n"), tmp_path, monkeypatch)
    with pytest.raises(ZeroDivisionError):
        run_document(page(tmp_path, "```python\n1 / 0\n```\n"), tmp_path, monkeypatch)


def test_hidden_setup_runs_and_a_skipped_block_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "<!-- docs: run\nanswer = 42\n-->\n\n"
        "```python\nprint(answer)\n```\n\n```text\n42\n```\n\n"
        "<!-- docs: skip (needs a server) -->\n```python\n1 / 0\n```\n"
    )
    run_document(page(tmp_path, text), tmp_path, monkeypatch)


def test_a_skip_without_a_reason_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "<!-- docs: skip -->\n```python\n1 / 0\n```\n"
    with pytest.raises(ValueError, match="needs a reason"):
        run_document(page(tmp_path, text), tmp_path, monkeypatch)


def test_a_file_block_is_saved_for_the_blocks_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "<!-- docs: file helper.py -->\n```python\nVALUE = 'saved'\n```\n\n"
        "```python\nimport sys\nsys.path.insert(0, '.')\nimport helper\nprint(helper.VALUE)\n"
        "sys.path.remove('.')\ndel sys.modules['helper']\n```\n\n```text\nsaved\n```\n"
    )
    run_document(page(tmp_path, text), tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("make no-such-target", "no target 'no-such-target'"),
        ("intention-kernel receipts forget X", "no command 'forget'"),
        ("intention-kernel receipts list --colour", "no option --colour"),
        ("pip install -e '.[no-such-extra]'", "no extra 'no-such-extra'"),
        (".venv/bin/python -m examples.no_such_example", "no such module"),
        ("python examples/no_such_file.py", "no such file"),
        ("rm -rf build", "not a command the docs know"),
    ],
)
def test_a_shell_block_naming_what_does_not_exist_fails(
    command: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(Exception, match=re.escape(problem)):
        run_document(page(tmp_path, f"```sh\n{command}\n```\n"), tmp_path, monkeypatch)


def test_a_shell_block_naming_what_exists_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "```sh\nmake demo   # a comment\nOPENAI_MODEL=x .venv/bin/python -m examples.travel --llm\n"
        "intention-kernel receipts resolve T K --applied --value '{}' \\\n    --note 'n'\n"
        "pip install -e '.[cli,postgres]'\n```\n"
    )
    run_document(page(tmp_path, text), tmp_path, monkeypatch)


def test_documents_are_parsed_by_sybil() -> None:
    document = sybil().parse(ROOT / "README.md")
    assert isinstance(document, Document)
    assert list(document.examples()), "the README has code blocks"


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ('```json\n{"a": 1,}\n```\n', "this json block does not parse"),
        ("```toml\n[a\n```\n", "this toml block does not parse"),
        ("```ini\nno section = 1\n```\n", "this ini block does not parse"),
        ("```yaml\na: [1\n```\n", "this yaml block does not parse"),
        ("```console\n$ make no-such-target\nmake: nothing\n```\n", "no target"),
        ("```ruby\nputs 1\n```\n", "mark it with <!-- docs: skip (reason) -->"),
    ],
)
def test_a_data_block_must_parse_and_an_unknown_language_be_marked(
    block: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(Exception, match=re.escape(problem)):
        run_document(page(tmp_path, block), tmp_path, monkeypatch)


def test_data_blocks_that_parse_and_a_console_session_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        '```json\n{"a": 1}\n```\n\n```toml\n[a]\nb = 1\n```\n\n'
        "```ini\n[pgbouncer]\npool_mode = session\n```\n\n```yaml\na: [1]\n```\n\n"
        "```console\n$ make demo\nanything the command printed\n```\n"
    )
    run_document(page(tmp_path, text), tmp_path, monkeypatch)


def test_a_doctest_session_runs_and_its_output_is_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = "```python\n>>> 1 + 1\n2\n>>> print('a...z')\na...\n```\n"
    run_document(page(tmp_path, right), tmp_path, monkeypatch)
    wrong = "```pycon\n>>> 1 + 1\n3\n```\n"
    with pytest.raises(Exception, match="Expected:"):
        run_document(page(tmp_path, wrong), tmp_path, monkeypatch)
