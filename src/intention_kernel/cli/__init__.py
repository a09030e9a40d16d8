"""The ``intention-kernel`` command (also ``python -m intention_kernel``).

The CLI is an optional extra: ``pip install 'intention-kernel[cli]'`` brings typer
and rich. Without them, :func:`main` says so and exits non-zero instead of
failing with a traceback.

Layout, so that command groups can be added without touching the others:

- :mod:`._app` assembles the typer application from the groups it lists.
- :mod:`._common` holds the conventions every command shares.
  Those are ``--db URL``, refusals and exit codes.
  ``--db`` defaults to ``$INTENTION_KERNEL_DB``, then ``sqlite:///intention-kernel.db``.
  Only :func:`~._common.resolve_db_url` resolves it.
- one private module per command or group (``_demo.py``, ``_serve.py``,
  ``_receipts.py``, ``_outbox.py``, ``_deploy.py`` for ``check`` and ``migrate``,
  ``_prune.py``), each exposing ``register(app)``.

Exit status 0 means success.
1 means a command ran and found a problem.
2 means a command refused its arguments or its store.
"""

from __future__ import annotations

import sys

__all__ = ["CLI_EXTRA_PACKAGES", "main"]

#: Top-level modules that the ``cli`` extra installs.
CLI_EXTRA_PACKAGES = frozenset({"typer", "rich"})


def main() -> None:
    """Entry point of the ``intention-kernel`` console script."""
    try:
        from intention_kernel.cli._app import app
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in CLI_EXTRA_PACKAGES:
            raise
        print(
            f"intention-kernel: the command-line interface needs {missing!r}, which is not "
            "installed.\nInstall the CLI extra:  pip install 'intention-kernel[cli]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    app(prog_name="intention-kernel")
