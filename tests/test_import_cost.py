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

    from intention_kernel import _checkpoint as checkpoint
    from intention_kernel._adapters import LazyAdapter, first_use_serializer
    from intention_kernel.durability._layout import codec as _layout_codec

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
    assert _layout_codec.encode_message(message) == first.decode()


#: Modules that only some paths need. The sync facade and its loop thread serve
#: sync callers. The operations serve a confirmation's timer, deploy checks and
#: retention. ``uuid`` serves an interaction's ID, and ``urllib.parse`` a store's
#: URL. Last, pydantic serves the first adapter, at a process's first turn.
RARE = (
    "intention_kernel._sync",
    "intention_kernel._loopthread",
    "intention_kernel.operations",
    "uuid",
    "urllib.parse",
    "pydantic",
)

RARE_PROBE = (
    "import sys\n"
    "import intention_kernel\n"
    f"print(' '.join(m for m in {RARE!r} if m in sys.modules) or '-')\n"
    "from intention_kernel import SyncKernel, TurnStream\n"
    "print(SyncKernel.__module__, TurnStream.__module__, 'SyncKernel' in dir(intention_kernel))\n"
)


def test_importing_the_package_loads_what_rare_paths_need_only_on_use() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RARE_PROBE], capture_output=True, text=True, check=True
    )
    loaded, names = done.stdout.splitlines()
    assert loaded == "-"
    assert names == "intention_kernel._sync intention_kernel._sync True"


MODEL_PROBE = """
import intention_kernel
from intention_kernel import InvalidInputError, capability
import pydantic

class Charge(pydantic.BaseModel):
    amount: int

@capability("pay", description="Pay")
async def pay(input: Charge, ctx):
    return {"paid": input.amount}

print(pay.input_model is Charge)
print(pay.parse_input({"amount": 3})[1])
try:
    pay.parse_input({"amount": "three"})
except InvalidInputError as exc:
    print(type(exc).__name__, exc.errors[0]["loc"])
"""


def test_a_pydantic_model_input_works_when_pydantic_loads_after_the_package() -> None:
    """The package no longer loads pydantic: a model defined after the import is
    still taken as the input's model, and its validation errors still translated."""
    done = subprocess.run(
        [sys.executable, "-c", MODEL_PROBE], capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [
        "True",
        "{'amount': 3}",
        "InvalidInputError ('amount',)",
    ]
