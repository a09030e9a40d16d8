"""The billing agent, ready to serve over HTTP.

    intention-kernel serve --agent intention_kernel._demo:serve_agent --db sqlite:///app.db

The fake provider keeps its ledger in a SQLite file of its own.
It is ``$INTENTION_KERNEL_DEMO_PROVIDER_DB`` if that is set.
Otherwise, when the store is a SQLite file, it sits beside it.
``app.db`` gets ``app.demo-provider.db``.
Otherwise (PostgreSQL) it is ``demo-provider.db`` in the current directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from intention_kernel._agent import Agent
from intention_kernel._demo.billing import build_agent
from intention_kernel._demo.provider import FakePaymentProvider

__all__ = ["DEFAULT_PROVIDER_DB", "PROVIDER_DB_ENV_VAR", "provider_path", "serve_agent"]

PROVIDER_DB_ENV_VAR = "INTENTION_KERNEL_DEMO_PROVIDER_DB"
#: The provider's file when neither the environment nor a SQLite store says where.
DEFAULT_PROVIDER_DB = "demo-provider.db"
_SUFFIX = ".demo-provider.db"


def provider_path(db_url: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """Where the demo provider keeps its ledger for the store at ``db_url``."""
    explicit = (os.environ if environ is None else environ).get(PROVIDER_DB_ENV_VAR)
    if explicit:
        return Path(explicit)
    # The SQLite URL rule of open_durability: sqlite:///relative.db, sqlite:////abs.db.
    scheme, _, rest = (db_url or "").partition("://")
    if scheme.lower() == "sqlite":
        store = Path(rest[1:] if rest.startswith("/") else rest)
        if store.name and str(store) != ":memory:":
            return store.with_name(store.stem + _SUFFIX)
    return Path(DEFAULT_PROVIDER_DB)


def serve_agent(db_url: str | None = None) -> Agent:
    """The demo billing agent with its fake provider (a factory for ``--agent``:
    ``serve`` passes the store's URL as ``db_url``; see :func:`provider_path`)."""
    return build_agent(FakePaymentProvider(provider_path(db_url)))
