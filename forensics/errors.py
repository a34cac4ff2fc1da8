"""Errors a user sees as one line, without a traceback."""


class ForensicsError(Exception):
    """A data or runtime problem the user can act on (exit code 1).

    The message names the file, the line and the field where one is known.
    """


class ManifestError(ForensicsError):
    """The case manifest is malformed: the message names the key."""


class EvidenceError(ForensicsError):
    """A whole evidence file could not be read (corrupt, truncated, wrong format).

    ``sha256`` and ``bytes`` identify the file when it could be read at all.
    """

    sha256: str | None = None
    bytes: int | None = None


class ResourceError(ForensicsError):
    """The machine, not the evidence, stopped the work (DuckDB ran out of memory under its
    limit). Nothing is recorded against the file being loaded: the command stops."""
