"""``import intention_kernel`` builds no pydantic adapter: a CLI command or a
serverless start pays the import every time, and the adapters were a third of it.
They are built at a process's first turn instead (``intention_kernel._adapters``)."""

from __future__ import annotations

import subprocess
import sys

PROBE = "import sys\nimport intention_kernel\nprint('pydantic.type_adapter' in sys.modules)\n"


def test_importing_the_package_builds_no_pydantic_adapter() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False"]


#: Packages of the optional extras (and the standard library's drivers) that only some
#: paths need: a store, the HTTP host, a bridge, tracing, the CLI.
EXTRAS = (
    "sqlite3",
    "psycopg",
    "psycopg_pool",
    "starlette",
    "uvicorn",
    "uvloop",
    "httpx",
    "nats",
    "opentelemetry",
    "jsonschema",
    "openai",
    "agents",
    "mcp",
    "pydantic_ai",
    "langgraph",
    "langchain_core",
    "typer",
    "rich",
)

EXTRAS_PROBE = (
    "import sys\n"
    "import intention_kernel\n"
    "from intention_kernel import Kernel, SyncKernel, capability\n"
    "print(' '.join(sorted({m.partition('.')[0] for m in sys.modules})))\n"
)


def test_importing_the_package_loads_no_optional_extra() -> None:
    """The core import (and its public names) loads no store driver, host, bridge,
    tracing or CLI package: each path imports its own when it is first used."""
    done = subprocess.run(
        [sys.executable, "-c", EXTRAS_PROBE], capture_output=True, text=True, check=True
    )
    loaded = set(done.stdout.split())
    assert "intention_kernel" in loaded
    assert sorted(loaded.intersection(EXTRAS)) == []


def test_a_serializer_stand_in_gives_way_to_the_serializer_at_its_first_call() -> None:
    import types

    from intention_kernel import checkpoint
    from intention_kernel._adapters import LazyAdapter, first_use_serializer

    namespace: dict[str, object] = {}
    adapter = LazyAdapter(checkpoint.Message)
    namespace["encode"] = first_use_serializer(namespace, "encode", adapter)
    assert isinstance(namespace["encode"], types.FunctionType)
    message = checkpoint.Message("user", "Zoë ✓", "t1")
    first = namespace["encode"](message)
    # Rebound: later calls go straight to pydantic's serializer, the same bytes.
    assert not isinstance(namespace["encode"], types.FunctionType)
    assert namespace["encode"](message) == first
    assert first == '{"role":"user","content":"Zoë ✓","turn_id":"t1"}'.encode()
    assert checkpoint.encode_message(message) == first.decode()
