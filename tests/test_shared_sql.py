"""The statements both SQL adapters send alike, and PostgreSQL's placeholder hook."""

from __future__ import annotations

import pytest

from intention_kernel.durability._layout import sql as _sql
from intention_kernel.durability.postgres import _statements as postgres_statements
from intention_kernel.durability.sqlite import _statements as sqlite_statements


def test_postgres_hook_spells_both_kinds_of_parameter_as_psycopg_does() -> None:
    rendered = _sql.postgres("SELECT 1 FROM t WHERE a = ? AND b = :b AND c = :b")
    assert rendered == "SELECT 1 FROM t WHERE a = %s AND b = %(b)s AND c = %(b)s"


@pytest.mark.parametrize("statement", ["SELECT a::text FROM t", "SELECT 'x%' FROM t"])
def test_postgres_hook_refuses_a_statement_it_cannot_rewrite_exactly(statement: str) -> None:
    with pytest.raises(ValueError, match="shared statement"):
        _sql.postgres(statement)


def test_each_adapter_sends_the_shared_statement_in_its_own_placeholders() -> None:
    assert sqlite_statements.SELECT_INBOX is _sql.SELECT_INBOX
    assert _sql.postgres(_sql.SELECT_INBOX) == postgres_statements.SELECT_INBOX
    assert "%s" in postgres_statements.SELECT_INBOX and "?" not in postgres_statements.SELECT_INBOX
