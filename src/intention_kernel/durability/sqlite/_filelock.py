"""Per-thread exclusive locks that die with their process, for SQLite files.

Why an OS lock and not a lease row?
A lease row costs a commit (a disk flush) to take, and another to release.
It costs them on every turn.
It also needs an expiry to recover from a dead holder.
A POSIX record lock costs two system calls.
It holds no database transaction while a model or a capability runs.
The kernel releases it the instant its process dies, ``kill -9`` included.

Each thread ID maps to one byte of a sidecar file (``<db>.locks``).
The byte's offset comes from a hash of the ID.
So no per-thread files accumulate.
Two IDs that collide only serialize against each other.
A turn holds one lock, so a collision can never deadlock.

POSIX record locks belong to a *process*, which has two consequences.
A second ``lockf`` on a range the process already holds succeeds.
Closing *any* descriptor of the file drops all of the process's locks on it.
So the process shares one descriptor per file.
It is closed only when no adapter uses it.
A per-process table of held offsets gives exclusion inside the process.
It covers tasks, threads and adapter instances alike.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import hashlib
import os
import threading
import time
import zlib
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType

from intention_kernel.errors import ThreadBusyError, ThreadLockTimeoutError

__all__ = ["LockFile", "lock_offset", "mark_offset"]

_OFFSET_MASK = (1 << 62) - 1
_MARK_MASK = (1 << 61) - 1
_FIRST_WAIT = 0.0005
_MAX_WAIT = 0.01
_CACHED_OFFSETS = 4096


def _byte_offset(name: str) -> int:
    """The byte of the lock file that stands for ``name``: a thread ID, or a tagged one."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _OFFSET_MASK


#: :func:`_byte_offset` of a thread ID, cached.
#: A thread's turns take its byte again and again.
#: A hit costs a dict lookup, not a hash of the ID (four calls).
lock_offset = functools.lru_cache(maxsize=_CACHED_OFFSETS)(_byte_offset)


#: Where the turns' marks start: above every byte that :func:`_byte_offset` gives.
_MARKS = 1 << 62


def mark_offset(thread_id: str, turn_id: str) -> int:
    """The byte of the lock file that marks a delivery of the turn.

    It lies at or above ``2**62``, where no thread's byte and no tag's lies. It
    mixes the thread's cached hash with a CRC of the turn ID: three calls. A blake2b
    of both IDs cost five, and a hasher object. Two turns of one thread share a mark only
    if their CRCs do. They never hold the lock at once, and a shared mark only
    makes a cancel answer ``"requested"``."""
    turn = zlib.crc32(turn_id.encode("utf-8", "surrogatepass"))
    return _MARKS | (lock_offset(thread_id) ^ turn << 29) & _MARK_MASK


@dataclass
class _Shared:
    fd: int
    users: int = 0
    held: set[int] = field(default_factory=set)
    mutex: threading.Lock = field(default_factory=threading.Lock)


_registry: dict[str, _Shared] = {}
_registry_mutex = threading.Lock()


def _forget_after_fork() -> None:
    # A forked child inherits the descriptors but none of the record locks.
    # Its table of held offsets would lie, so it starts from scratch.
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
            if offset in shared.held or not _take_byte(shared.fd, offset):
                return False
            shared.held.add(offset)
            return True

    def try_acquire_marked(self, offset: int, mark: int) -> tuple[bool, bool]:
        """Take the byte at ``offset``, then the byte at ``mark`` if it is free.

        It answers which of the two it took. The mark is never taken alone. One
        hold of the table's mutex covers both: one call where two cost twice."""
        shared = self._shared
        if shared is None:
            raise RuntimeError("lock file is closed")
        with shared.mutex:
            held = shared.held
            if offset in held or not _take_byte(shared.fd, offset):
                return False, False
            try:
                marked = mark not in held and _take_byte(shared.fd, mark)
            except BaseException:  # the lock is let go with the mark's error
                fcntl.lockf(shared.fd, fcntl.LOCK_UN, 1, offset)
                raise
            held.add(offset)
            if marked:
                held.add(mark)
            return True, marked

    def busy(self, offset: int) -> bool:
        """Whether any process, this one included, holds the byte at ``offset``.

        It takes the byte and lets it go at once when it is free. The table's mutex
        is held throughout: no task of this process takes the byte in between.
        """
        shared = self._shared
        if shared is None:
            raise RuntimeError("lock file is closed")
        with shared.mutex:
            if offset in shared.held or not _take_byte(shared.fd, offset):
                return True
            fcntl.lockf(shared.fd, fcntl.LOCK_UN, 1, offset)
            return False

    def release(self, offset: int, mark: int | None = None) -> None:
        """Let go of the byte at ``offset``, and first of the byte at ``mark`` if given."""
        shared = self._shared
        if shared is None:
            return
        with shared.mutex:
            held = shared.held
            if mark is not None and mark in held:
                fcntl.lockf(shared.fd, fcntl.LOCK_UN, 1, mark)
                held.discard(mark)
            if offset in held:
                fcntl.lockf(shared.fd, fcntl.LOCK_UN, 1, offset)
                held.discard(offset)

    def hold(
        self, thread_id: str, wait_seconds: float, *, wait: bool = True
    ) -> AbstractAsyncContextManager[None]:
        """Hold the thread's lock, polling with backoff.

        After ``wait_seconds`` it raises ``ThreadLockTimeoutError``.
        With ``0``, it raises after the one attempt.
        With ``wait=False`` it makes one attempt.
        Then it raises ``ThreadBusyError`` at once if another turn holds the lock.
        """
        return _Hold(self, thread_id, wait_seconds, wait)


class _Hold:
    """:meth:`LockFile.hold`'s context manager.

    It is a class, not a generator, because every turn enters one.
    An ``asynccontextmanager`` costs several frames more per turn.
    """

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


def _take_byte(fd: int, offset: int) -> bool:
    """Lock the byte at ``offset`` without waiting; ``False`` if another process holds it."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True
