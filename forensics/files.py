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


class BatchedWrites:
    """Many files written as :func:`write_atomic` writes one, put on disk by one flush.

    Each file goes to its temporary name as it comes (nothing waits in memory). When the block
    ends without error, one flush of the filesystem puts them all on disk (``syncfs`` where the
    system has it, else each file's own ``fsync``), and only then is each renamed over its real
    name: every file is still complete or absent under its real name, and on disk before its
    rename. A report writes a notice and a CSV per notified tenant; flushing each file on its
    own, even eight at a time, was a fifth of the report (10,000 files). On a failure the
    temporary files are removed and the error is raised as one line naming the file (or the
    folder, when the flush fails); files renamed before it stay.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with BatchedWrites() as files:
    ...     for i in range(3):
    ...         files.write(folder / f"{i}.txt", b"x")
    ...     sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    []
    >>> sorted(p.name for p in folder.iterdir())
    ['0.txt', '1.txt', '2.txt']
    """

    def __init__(self) -> None:
        self._files: list[tuple[str, Path]] = []

    def write(self, path: Path, data: bytes) -> None:
        try:
            fd, tmp = tempfile.mkstemp(
                dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX
            )
        except OSError as exc:
            raise ForensicsError(f"{path}: cannot write the file ({_reason(exc)})") from None
        self._files.append((tmp, path))
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise ForensicsError(f"{path}: cannot write the file ({_reason(exc)})") from None

    def __enter__(self) -> BatchedWrites:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        done = 0
        try:
            if exc_type is None:
                self._flush()
                for tmp, path in self._files:
                    try:
                        os.replace(tmp, path)
                    except OSError as err:
                        raise ForensicsError(
                            f"{path}: cannot write the file ({_reason(err)})"
                        ) from None
                    done += 1
        finally:
            for tmp, _ in self._files[done:]:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self._files = []

    def _flush(self) -> None:
        for folder in dict.fromkeys(path.parent for _, path in self._files):
            try:
                flushed = sync_filesystem(folder)
            except OSError as exc:
                raise ForensicsError(f"{folder}: cannot write the files ({_reason(exc)})") from None
            if flushed:
                continue
            for tmp, path in self._files:
                if path.parent != folder:
                    continue
                try:
                    fd = os.open(tmp, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    raise ForensicsError(
                        f"{path}: cannot write the file ({_reason(exc)})"
                    ) from None


def sync_filesystem(folder: Path) -> bool:
    """Put everything written to ``folder``'s filesystem on disk with one ``syncfs`` call;
    False, having done nothing, where the system has no such call (each file is then flushed
    on its own).

    Raises:
        OSError: the flush failed (Linux reports a failed write-back here since 5.8).
    """
    import ctypes

    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(folder, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)
    return True


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
