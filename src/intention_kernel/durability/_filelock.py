"""Per-thread exclusive locks that die with their process, for SQLite files.

Why an OS lock and not a lease row: a lease row costs a commit (a disk flush)
to take and another to release, on every turn, and needs an expiry to recover
from a dead holder. A POSIX record lock costs two system calls, holds no
database transaction while a model or a capability runs, and the kernel
releases it the instant its process dies (``kill -9`` included).

Each thread ID maps to one byte of a sidecar file (``<db>.locks``) at an
offset derived from a hash of the ID, so no per-thread files accumulate. Two
IDs that collide only serialize against each other; a turn holds one lock, so
a collision can never deadlock.

POSIX record locks belong to a *process*: a second ``lockf`` on a range the
same process already holds succeeds, and closing *any* descriptor of the file
drops all of the process's locks on it. Both are handled here: one shared
descriptor per file for the whole process (closed only when no adapter uses
it), and a per-process table of held offsets that gives in-process exclusion
between tasks, threads and adapter instances.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import os
import threading
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType

from intention_kernel.errors import ThreadBusyError, ThreadLockTimeoutError

__all__ = ["LockFile", "lock_offset"]

_OFFSET_MASK = (1 << 62) - 1
_FIRST_WAIT = 0.0005
_MAX_WAIT = 0.01


def lock_offset(thread_id: str) -> int:
    """The byte of the lock file that stands for ``thread_id``."""
    digest = hashlib.blake2b(thread_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _OFFSET_MASK


@dataclass
class _Shared:
    fd: int
    users: int = 0
    held: set[int] = field(default_factory=set)
    mutex: threading.Lock = field(default_factory=threading.Lock)


_registry: dict[str, _Shared] = {}
_registry_mutex = threading.Lock()


def _forget_after_fork() -> None:
    # A forked child inherits the descriptors but none of the parent's record
    # locks; its table of held offsets would lie, so start from scratch.
    _registry.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class LockFile:
    """Exclusive per-thread locks over one sidecar file, shared process-wide."""

    def __init__(self, path: str) -> None:
        self._path = os.path.realpath(path)
        self._shared: _Shared | None = None

    def open(self) -> None:
        with _registry_mutex:
            shared = _registry.get(self._path)
            if shared is None:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                shared = _registry[self._path] = _Shared(fd)
            shared.users += 1
            self._shared = shared

    def close(self) -> None:
        with _registry_mutex:
            shared, self._shared = self._shared, None
            if shared is None:
                return
            shared.users -= 1
            if shared.users == 0 and _registry.get(self._path) is shared:
                del _registry[self._path]
                os.close(shared.fd)

    def try_acquire(self, offset: int) -> bool:
        shared = self._shared
        if shared is None:
            raise RuntimeError("lock file is closed")
        with shared.mutex:
            if offset in shared.held:
                return False
            try:
                fcntl.lockf(shared.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    return False
                raise
            shared.held.add(offset)
            return True

    def release(self, offset: int) -> None:
        shared = self._shared
        if shared is None:
            return
        with shared.mutex:
            if offset in shared.held:
                fcntl.lockf(shared.fd, fcntl.LOCK_UN, 1, offset)
                shared.held.discard(offset)

    def hold(
        self, thread_id: str, wait_seconds: float, *, wait: bool = True
    ) -> AbstractAsyncContextManager[None]:
        """Hold the thread's lock; poll with backoff, ``ThreadLockTimeoutError`` after
        ``wait_seconds`` (``0``: after the one attempt). ``wait=False``: one attempt, and
        ``ThreadBusyError`` at once if another holds it."""
        return _Hold(self, thread_id, wait_seconds, wait)


class _Hold:
    """:meth:`LockFile.hold`'s context manager: a class, not a generator, because every
    turn enters one (``asynccontextmanager`` costs several frames more per turn)."""

    __slots__ = ("_file", "_offset", "_thread_id", "_wait", "_wait_seconds")

    def __init__(self, file: LockFile, thread_id: str, wait_seconds: float, wait: bool) -> None:
        self._file = file
        self._thread_id = thread_id
        self._wait_seconds = wait_seconds
        self._wait = wait
        self._offset: int | None = None

    async def __aenter__(self) -> None:
        file, thread_id = self._file, self._thread_id
        offset = lock_offset(thread_id)
        if not file.try_acquire(offset):
            if not self._wait:
                raise ThreadBusyError(
                    f"thread {thread_id!r} is busy: another turn holds it", thread_id=thread_id
                )
            wait_seconds = self._wait_seconds
            deadline = time.monotonic() + wait_seconds
            pause = _FIRST_WAIT
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ThreadLockTimeoutError(
                        f"thread {thread_id!r} stayed locked by another turn for {wait_seconds}s",
                        thread_id=thread_id,
                    )
                await asyncio.sleep(min(pause, remaining))
                pause = min(pause * 2, _MAX_WAIT)
                if file.try_acquire(offset):
                    break
        self._offset = offset

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        offset, self._offset = self._offset, None
        if offset is not None:
            self._file.release(offset)
