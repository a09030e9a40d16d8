"""Worker processes forked from a server that imported their script's modules once.

A bridge worker spends most of its CPU importing its SDK: about a second for Pydantic
AI, two for the OpenAI Agents SDK. The crash tests start hundreds of them. Here a
server per script imports the script once, without running it. Each worker is then a
fork of that server, which runs the script as ``__main__``.

A worker stays a real process: its own pid, its own stdio pipes, and signals sent to
it by pid. SIGKILL kills it, and SIGSTOP pauses it. Its exit status reaches the test
as asyncio's would: the code, or minus the signal's number. Its parent differs: the
server waits on it and sends the test its status. And the workers of one server
share its hash seed, as they share everything it imported.

Run as ``python tests/prefork.py SCRIPT SOCKET``, the server reads requests on
``SOCKET``. Each holds the worker's argv, environment and directory, and three file
descriptors for its stdin, stdout and stderr. The server answers with the pid, then
the exit status. It exits when its own stdin closes, that is when the test process
that started it ends.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

#: The largest request: argv, environment and directory as JSON.
MAX_REQUEST = 1 << 20


# -- the server ------------------------------------------------------------------------


def serve(script: str, path: str) -> tuple[dict[str, Any], list[int]] | None:
    """Serve requests until stdin closes. In a forked worker, return its request."""
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__prefork__")  # imports; its main guard stays shut
    # A fork copies only the forking thread: another's locks would stay held.
    assert threading.active_count() == 1, f"{script} started threads on import"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    print("ready", flush=True)
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd: (pid, the test's socket)
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                return None  # the test process ended
            if key.data == "accept":
                connection, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST, 3)
                pid = os.fork()
                if pid == 0:
                    # The worker keeps none of the server's sockets or pidfds.
                    for pidfd, (_, other) in waiting.items():
                        os.close(pidfd)
                        other.close()
                    selector.close()
                    listener.close()
                    connection.close()
                    return json.loads(message), fds
                for fd in fds:
                    os.close(fd)
                connection.sendall(str(pid).encode())
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, connection)
                selector.register(pidfd, selectors.EVENT_READ, "exit")
            else:  # a worker exited: reap it, and tell its test how
                pidfd = key.fd
                selector.unregister(pidfd)
                os.close(pidfd)
                pid, connection = waiting.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the test may have stopped listening
                    connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())
                connection.close()


def become(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this forked server into the worker: its stdio, environment and argv."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]  # sys.path[0] is the script's directory already
    runpy.run_path(sys.argv[0], run_name="__main__")


# -- the client, in the test process ---------------------------------------------------


class Server:
    """One prefork server for ``script``, started by this test process."""

    def __init__(self, script: Path) -> None:
        self.directory = tempfile.mkdtemp(prefix="ik-prefork-")
        self.path = os.path.join(self.directory, "socket")
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(script), self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()
        assert ready == b"ready\n", f"the prefork server of {script} did not start: {ready!r}"
        atexit.register(self.close)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # the server's cue to exit
        self.process.wait()
        if os.path.exists(self.path):
            os.unlink(self.path)
        os.rmdir(self.directory)


_servers: dict[Path, Server] = {}
_starting = threading.Lock()


def _server(script: Path) -> Server:
    # Two tests of one process may ask at once: one server per script.
    with _starting:
        if script not in _servers:
            _servers[script] = Server(script)
        return _servers[script]


class Forked:
    """A worker forked from a prefork server: what asyncio's ``Process`` offers.

    As with asyncio's, ``returncode`` is set when the worker ends, awaited or not."""

    def __init__(
        self,
        pid: int,
        connection: socket.socket,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = stdout
        self.stderr = stderr
        self._ended = asyncio.ensure_future(self._watch(connection))

    async def _watch(self, connection: socket.socket) -> int:
        """The status its server sends when it reaps the worker."""
        with connection:
            status = await asyncio.get_running_loop().sock_recv(connection, 64)
        assert status, f"the prefork server lost worker {self.pid}"
        self.returncode = int(status)
        return self.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    async def communicate(self) -> tuple[bytes, bytes]:
        stdout, stderr, _ = await asyncio.gather(
            self.stdout.read(), self.stderr.read(), self.wait()
        )
        return stdout, stderr

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def _reader(fd: int, limit: int) -> asyncio.StreamReader:
    """An asyncio reader of the pipe's end ``fd``, closed at its end."""
    reader = asyncio.StreamReader(limit)
    protocol = asyncio.StreamReaderProtocol(reader)
    await asyncio.get_running_loop().connect_read_pipe(lambda: protocol, os.fdopen(fd, "rb"))
    return reader


async def spawn(script: Path, *args: str, limit: int = 1 << 16) -> Forked:
    """Start ``script`` with ``args`` as a worker of its prefork server.

    Its stdout and stderr are pipes to the test; its stdin reads nothing. ``limit``
    bounds a line read from them, as in asyncio's ``create_subprocess_exec``."""
    server = await asyncio.to_thread(_server, script)
    loop = asyncio.get_running_loop()
    readers = []
    ends = [os.open(os.devnull, os.O_RDONLY)]
    for _ in range(2):
        read, write = os.pipe()
        readers.append(await _reader(read, limit))
        ends.append(write)
    request = {"argv": [str(script), *args], "env": dict(os.environ), "cwd": os.getcwd()}
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(server.path)
        socket.send_fds(connection, [json.dumps(request).encode()], ends)
    finally:
        for fd in ends:
            os.close(fd)  # the worker holds its own copies now
    connection.setblocking(False)
    pid = await loop.sock_recv(connection, 64)
    assert pid, f"the prefork server of {script} did not fork"
    return Forked(int(pid), connection, readers[0], readers[1])


if __name__ == "__main__":
    job = serve(sys.argv[1], sys.argv[2])
    if job is not None:
        become(*job)
