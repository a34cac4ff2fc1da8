"""What a damaged ``.gz`` or ``.zst`` evidence file still holds before its damage.

Healthy files never come here: readers decompress with Arrow in large blocks, which is fast but
drops a whole block when the data breaks off. Only after Arrow reports an error is a file read
again here, in small steps with Python's decoders, so that every byte that decodes before the
damage is kept (what ``zcat FILE | head`` prints) and the damage is located: truncated at the
end, or corrupt at a given byte.

Gzip files may hold several members and zstd files several frames; each is decoded in turn, as
``zcat`` does, and the first one that breaks ends the readable data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Compressed bytes fed to the decoder per step. A step that fails is replayed byte by byte, so
# the step size only trades speed against the cost of that replay.
_STEP = 64 << 10


@dataclass(frozen=True)
class Damage:
    """Where and how a compressed file is damaged.

    Attributes:
        codec: ``gzip`` or ``zstd``.
        truncated: the file ends in the middle of compressed data (else it is corrupt).
        offset: compressed bytes before the damage: the file size when truncated, else the
            bytes before the one at which the decoder found the data corrupt.
        size: bytes in the file.
        detail: the decoder's own words for corrupt data (empty when truncated).
    """

    codec: str
    truncated: bool
    offset: int
    size: int
    detail: str = ""

    @property
    def checksum(self) -> bool:
        """The data decoded but failed its checksum: what was read may hold damaged bytes."""
        detail = self.detail.lower()
        # zlib: "incorrect data check" / "incorrect length check"; zstd: "... checksum".
        return not self.truncated and any(
            word in detail for word in ("data check", "length check", "checksum")
        )

    def describe(self) -> str:
        """One phrase for messages.

        >>> Damage("gzip", True, 1234567, 1234567).describe()
        'truncated gzip data after 1,234,567 bytes'
        >>> Damage("zstd", False, 4095, 9808, "Data corruption detected").describe()
        'corrupt zstd data detected at byte 4,096 of 9,808 (Data corruption detected)'
        """
        if self.truncated:
            return f"truncated {self.codec} data after {self.offset:,} bytes"
        # Bytes are counted from 1 here, as a hex viewer's offset + 1 or `cmp` would.
        return (
            f"corrupt {self.codec} data detected at byte {self.offset + 1:,} of {self.size:,} "
            f"({self.detail})"
        )


def _decoder(codec: str):
    """A fresh decoder for one gzip member or zstd frame, and the exception it raises."""
    if codec == "gzip":
        import zlib

        return zlib.decompressobj(31), zlib.error
    import zstandard

    return zstandard.ZstdDecompressor().decompressobj(), zstandard.ZstdError


def _error_text(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # zlib says "Error -3 while decompressing data: invalid distance too far back"; the reader
    # needs the last part.
    return text.rsplit(": ", 1)[-1] if "decompress" in text else text


class Salvage:
    """The decompressed blocks of a ``.gz`` or ``.zst`` file up to its damage.

    Iterate once; afterwards ``damage`` says where the data broke off (None when the whole file
    decoded). ``skip`` drops that many decompressed bytes from the front, for a caller that
    already holds them. ``tell()`` gives the compressed bytes consumed so far (for progress).
    """

    def __init__(self, path: Path, codec: str, skip: int = 0):
        self.path, self.codec = Path(path), codec
        self.damage: Damage | None = None
        self._skip = skip
        self._pos = 0

    def tell(self) -> int:
        """Compressed bytes decoded so far."""
        return self._pos

    def _emit(self, out: bytes) -> bytes:
        if self._skip:
            if len(out) <= self._skip:
                self._skip -= len(out)
                return b""
            out, self._skip = out[self._skip :], 0
        return out

    def __iter__(self) -> Iterator[bytes]:
        size = self.path.stat().st_size
        with open(self.path, "rb") as fh:
            decoder, error = _decoder(self.codec)
            start = 0  # file offset where the current member or frame begins
            fed = False  # the current decoder has been given bytes
            pending = b""
            while True:
                if not pending:
                    pending = fh.read(_STEP)
                    if not pending:
                        break
                # zlib can snapshot its state; zstd cannot and is rebuilt by replaying instead.
                saved = decoder.copy() if hasattr(decoder, "copy") else None
                try:
                    out = decoder.decompress(pending)
                except error as exc:
                    if saved is None:
                        decoder = self._replay(fh, start, self._pos)
                    else:
                        decoder = saved
                    # The failing step again, byte by byte: everything before the bad byte
                    # decodes. (``bad`` keeps the step's end only if the decoder accepted byte
                    # by byte what it refused at once, which it does not.)
                    bad = len(pending)
                    for i in range(len(pending)):
                        try:
                            out = decoder.decompress(pending[i : i + 1])
                        except error:
                            bad = i
                            break
                        if out := self._emit(out):
                            yield out
                    self._pos += bad
                    self.damage = Damage(self.codec, False, self._pos, size, _error_text(exc))
                    return
                fed = True
                if decoder.eof:
                    rest = decoder.unused_data
                    self._pos += len(pending) - len(rest)
                    pending = rest
                    decoder, error = _decoder(self.codec)
                    start, fed = self._pos, False
                else:
                    self._pos += len(pending)
                    pending = b""
                if out := self._emit(out):
                    yield out
        if fed and not decoder.eof:
            if hasattr(decoder, "flush"):
                try:
                    if out := self._emit(decoder.flush()):
                        yield out
                except error:
                    pass  # nothing more decodes from a cut stream; the damage says so below
            self.damage = Damage(self.codec, True, self._pos, size)

    def _replay(self, fh, start: int, end: int):
        """A decoder in the state it had after the compressed bytes ``start`` to ``end``."""
        decoder, _ = _decoder(self.codec)
        here = fh.tell()
        fh.seek(start)
        left = end - start
        while left > 0:
            chunk = fh.read(min(_STEP, left))
            decoder.decompress(chunk)  # already handed out before the failing step
            left -= len(chunk)
        fh.seek(here)
        return decoder


class CompleteRecords:
    """A readable stream of the complete records of a damaged file, for Arrow's CSV reader.

    Data is released only up to the last record end seen so far: a newline outside quotes (a
    quoted value may span lines; quotes are counted as RFC 4180 writes them, a doubled quote
    inside a quoted value counting twice). When the damage is reached, the held-back rest is
    the record the damage cut, kept in ``cut`` instead of being read: Arrow would otherwise
    take a cut value such as ``"acct_12`` for a whole one.
    """

    def __init__(self, salvage: Salvage, quote: bytes = b'"'):
        self.salvage = salvage
        self.cut = b""
        self.closed = False
        self._blocks: Iterator[bytes] | None = iter(salvage)
        self._quote = quote
        self._buf = b""
        self._at = 0
        # The held-back data since the last record end, in pieces (joined once a record end
        # arrives, so noise without newlines costs linear time), and its number of quotes.
        self._pending: list[bytes] = []
        self._quotes = 0

    def _record_end(self, block: bytes) -> int:
        """Length of the longest prefix of ``block`` that ends a record, or -1.

        Released data always ends a record, so what is held back starts outside quotes, and a
        newline ends a record when an even number of quotes precedes it there.
        """
        end = block.rfind(b"\n")
        if end < 0:
            return -1
        quotes = self._quotes + block.count(self._quote, 0, end)
        while quotes % 2:
            before = block.rfind(b"\n", 0, end)
            if before < 0:
                return -1
            quotes -= block.count(self._quote, before, end)
            end = before
        return end + 1

    def _fill(self) -> None:
        while self._at >= len(self._buf) and self._blocks is not None:
            block = next(self._blocks, None)
            if block is None:
                self._blocks = None
                rest = b"".join(self._pending)
                self._pending, self._quotes = [], 0
                if self.salvage.damage is None:
                    self._buf, self._at = rest, 0
                else:
                    self.cut = rest
                return
            end = self._record_end(block)
            if end < 0:
                self._pending.append(block)
                self._quotes += block.count(self._quote)
                continue
            self._buf, self._at = b"".join([*self._pending, block[:end]]), 0
            self._pending = [block[end:]]
            self._quotes = block.count(self._quote, end)

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes of complete records (all that is left when negative)."""
        if size is None or size < 0:
            parts = []
            while chunk := self.read(_STEP):
                parts.append(chunk)
            return b"".join(parts)
        self._fill()
        out = self._buf[self._at : self._at + size]
        self._at += len(out)
        return out

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.salvage.tell()

    def close(self) -> None:
        self.closed = True
