"""A child process spoken to in JSON lines: one request a line, one answer a line.

The coordinator's row workers and the hand-off group's children use it."""

from __future__ import annotations

import json
import subprocess
from typing import Any

__all__ = ["LineProcess"]


class LineProcess:
    """A child process started by a subclass, as ``self.proc``, with piped text I/O."""

    proc: subprocess.Popen[str]

    def died(self) -> str:
        """What a missing answer says about the child."""
        return f"child {self.proc.pid} died (exit {self.proc.wait()})"

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(self.died())
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.receive()
