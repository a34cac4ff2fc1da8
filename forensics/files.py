"""Private, all-or-nothing files: how the report, the notices and the case database are written.

Outputs hold customer data. Folders the tool creates are 0700 and files 0600, or stricter when
the umask says so (the mode is given when the file is created, never widened afterwards).
Every file is written to a temporary name in its own folder and renamed over its real name
only once it is complete, so a crash, a kill or a full disk leaves the previous file or no
file, never a cut one under the real name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from forensics.errors import ForensicsError

# Temporary files are named ".<name>.<random>.partial"; a run that was killed leaves them.
PARTIAL_SUFFIX = ".partial"


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def umask() -> int:
    """The process umask (reading it means setting it; it is set straight back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def private_dirs(folder: Path) -> None:
    """Create ``folder`` and its missing parents, each 0700 (less if the umask says so).

    Folders that exist are left as they are: ``--out .`` must not change the current folder.

    Raises:
        ForensicsError: a folder cannot be created (one line naming it).
    """
    missing = []
    current = Path(folder)
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not path.is_dir():
                raise ForensicsError(
                    f"{path}: cannot create the folder (a file has its name)"
                ) from None
        except OSError as exc:
            raise ForensicsError(f"{path}: cannot create the folder ({_reason(exc)})") from None


def write_atomic(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or chunks of them as they are made) to ``path`` through a
    temporary file in the same folder.

    The temporary file is created 0600 (less if the umask says so), written, flushed to disk
    and renamed over ``path``; on any failure it is removed and ``path`` is untouched.

    Raises:
        ForensicsError: the file cannot be written (a full disk, a folder that is not
            writable), one line naming it.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX)
    except OSError as exc:
        raise ForensicsError(f"{path}: cannot write the file ({_reason(exc)})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in [data] if isinstance(data, bytes) else data:
                fh.write(chunk)
            fh.flush()
            # On disk before the rename: a power cut must not leave an empty file behind the
            # real name either. A full disk may only show here.
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ForensicsError(f"{path}: cannot write the file ({_reason(exc)})") from None
        raise


class ParallelWrites:
    """Many files written as :func:`write_atomic` writes one, several at a time.

    Each file is still complete or absent under its real name, and on disk before its
    rename; but the waits for the disk overlap (a report writes a notice and a CSV per
    notified tenant: thousands of flushes, most of the report's time when made one by one).
    At most ``4 * workers`` files wait in memory, so the cost stays bounded whatever the
    count. The first failure is raised when the block ends (or at a later ``write``); files
    already renamed stay, the rest are removed or never started.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with ParallelWrites() as files:
    ...     for i in range(3):
    ...         files.write(folder / f"{i}.txt", b"x")
    >>> sorted(p.name for p in folder.iterdir())
    ['0.txt', '1.txt', '2.txt']
    """

    def __init__(self, workers: int = 8):
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._pending: deque = deque()
        self._limit = 4 * workers

    def write(self, path: Path, data: bytes) -> None:
        while len(self._pending) >= self._limit:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(write_atomic, path, data))

    def __enter__(self) -> ParallelWrites:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                while self._pending:
                    self._pending.popleft().result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


def sync_dir(folder: Path) -> None:
    """Make the renames in ``folder`` durable (best effort: not every system can)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_partials(folder: Path) -> None:
    """Delete the temporary files a killed run left in ``folder``."""
    if folder.is_dir():
        for leftover in folder.glob(f".*{PARTIAL_SUFFIX}"):
            with contextlib.suppress(OSError):
                leftover.unlink()


def make_private(path: Path) -> None:
    """Narrow a file the tool just created (by a library that picks its own mode, such as the
    case database) to 0600, or less if the umask says so."""
    with contextlib.suppress(OSError):
        os.chmod(path, 0o600 & ~umask())
