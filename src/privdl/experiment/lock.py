"""A lock file one process holds across hosts that share a folder: ``runs/<run_id>/.lock`` of the results store.

A lock names its holder (host and pid), is created whole or not at all (a finished file hard-linked to its name),
is refreshed every :data:`LOCK_BEAT` seconds by one daemon thread of the holding process (:data:`HEARTBEAT`), and
is taken over when its holder is gone: a process of this host that no longer runs, or any lock silent for
:data:`LOCK_STALE` seconds (a crash on another host, a folder copied with its locks). The store
(:class:`privdl.experiment.store.ResultStore`) decides when to take and release one.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import NamedTuple

from privdl.errors import FileError

#: seconds between two refreshes of the time stamp of a lock this process holds
LOCK_BEAT = 10.0
#: a lock whose time stamp is older than this (seconds) belongs to a process that is gone or frozen: taken over
LOCK_STALE = 120.0


def holder_name() -> str:
    """This process as its locks name it (computed each time: a forked process is another process)."""
    return f"{socket.gethostname()} {os.getpid()}"


def create_whole(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` if no file has that name, atomically: a finished temporary file is
    hard-linked to the name, so another process sees the file whole or not at all. False if the name exists."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
    try:
        tmp.write_text(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: exclusive creation, then the content
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(text)
        return True
    except OSError as exc:
        raise FileError(f"cannot write {path} ({exc.strerror or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)


class Held(NamedTuple):
    """A lock file's holder as the file says (host, pid) and the time stamp its holder last refreshed."""

    host: str
    pid: int
    mtime_ns: int

    def __str__(self) -> str:
        return f"host {self.host}, pid {self.pid}" if self.pid else "a lock naming no process"

    def age(self) -> float:
        return time.time() - self.mtime_ns / 1e9

    def mine(self) -> bool:
        return f"{self.host} {self.pid}" == holder_name()

    def gone(self) -> str | None:
        """Why the holder is gone ("ended": a process of this host that no longer runs; "not refreshed for …": any
        host), or None while it may be running."""
        if not self.pid:
            return "it names no process"
        if self.host == socket.gethostname() and not alive(self.pid):
            return "ended"
        if self.age() > LOCK_STALE:
            return f"not refreshed for {self.age():.0f} s, more than {LOCK_STALE:.0f} s"
        return None


def holder(lock: Path) -> Held | None:
    """The holder of a lock file, or None where there is none."""
    try:
        st = lock.stat()
        parts = lock.read_text(errors="replace").split()
    except FileNotFoundError:
        return None
    except OSError:
        return Held("?", 0, 0)
    if len(parts) == 2 and parts[1].isdigit():
        return Held(parts[0], int(parts[1]), st.st_mtime_ns)
    return Held("?", 0, st.st_mtime_ns)


def take_over(lock: Path, held: Held) -> bool:
    """Remove the stale lock ``held`` so that it can be created anew: it is moved aside first (one process's
    rename succeeds), and put back if what was moved is not that lock (another process took it over and holds it
    since). True if the name is free now."""
    aside = lock.with_name(f".lock.stale.{os.getpid()}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    moved = holder(aside)
    if moved == held:
        aside.unlink(missing_ok=True)
        return True
    try:
        os.link(aside, lock)  # a fresh lock of another process: its again
    except OSError:
        pass
    aside.unlink(missing_ok=True)
    return False


class Heartbeat:
    """The locks this process holds; one daemon thread refreshes their time stamps every :data:`LOCK_BEAT`
    seconds, so that other processes (on any host sharing the folder) see their holder alive."""

    def __init__(self) -> None:
        self.held: set[Path] = set()
        self.guard = threading.Lock()
        self.pid: int | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A forked child holds none of its parent's locks, and no thread: its first lock starts its own."""
        self.held, self.guard, self.pid = set(), threading.Lock(), None

    def add(self, lock: Path) -> None:
        with self.guard:
            self.held.add(lock)
            if self.pid != os.getpid():  # first lock of this process (a fork copies no threads)
                self.pid = os.getpid()
                threading.Thread(target=self._beat, name="privdl-lock-heartbeat", daemon=True).start()

    def discard(self, lock: Path) -> None:
        with self.guard:
            self.held.discard(lock)

    def _beat(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(min(LOCK_BEAT, 1.0))  # (a changed LOCK_BEAT applies within a second)
            if time.monotonic() - last < LOCK_BEAT:
                continue
            last = time.monotonic()
            with self.guard:
                held = list(self.held)
            for lock in held:
                try:
                    os.utime(lock)
                except OSError:
                    pass


HEARTBEAT = Heartbeat()


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["HEARTBEAT", "LOCK_BEAT", "LOCK_STALE", "Heartbeat", "Held", "alive", "create_whole", "holder",
           "holder_name", "take_over"]
