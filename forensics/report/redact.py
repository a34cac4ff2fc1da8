"""Keyed pseudonyms for tenant ids in the shareable report.

A pseudonym is ``tenant-`` plus the first 12 hex digits of HMAC-SHA256(key, tenant id): the
same key always gives the same pseudonym (reports of one incident can be compared), a different
key gives unrelated ones, and without the key nobody can test a guessed tenant id against it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable

from forensics.errors import ForensicsError

KEY_ENV = "FORENSICS_REDACT_KEY"


def resolve_key(key: str | None) -> bytes:
    """The redaction key: the given one, else ``$FORENSICS_REDACT_KEY``.

    Raises:
        ForensicsError: neither is set (or the key is empty).
    """
    value = key if key else os.environ.get(KEY_ENV, "")
    if not value:
        raise ForensicsError(
            f"--redact needs a key: set {KEY_ENV} or pass --redact-key "
            "(the same key gives the same pseudonyms)"
        )
    return value.encode("utf-8")


def pseudonym(tenant_id: str, key: bytes) -> str:
    """The stable keyed pseudonym of one tenant id.

    >>> pseudonym("acct_1", b"k")
    'tenant-d0c3c7d7deea'
    """
    digest = hmac.new(key, tenant_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"tenant-{digest[:12]}"


class Redactor:
    """Maps tenant ids to pseudonyms, in identifier fields and inside free text.

    With ``key=None`` it is the identity, so the report code has one path for both modes.

    Args:
        tenant_ids: every tenant id the report may mention (free text is scrubbed of these).
        key: the HMAC key, or None for an unredacted report.
    """

    def __init__(self, tenant_ids: Iterable[str], key: bytes | None):
        self.key = key
        ids = sorted({t for t in tenant_ids if t}, key=lambda t: (-len(t), t))
        self._map = {t: pseudonym(t, key) for t in ids} if key else {}
        # Longest first so that "acct_1" never eats the front of "acct_10"; the lookarounds stop
        # a short id from matching inside a longer word that is not a tenant id.
        self._pattern = (
            re.compile(r"(?<![\w.-])(" + "|".join(re.escape(t) for t in ids) + r")(?![\w-])")
            if key and ids
            else None
        )

    @property
    def active(self) -> bool:
        """Whether tenant ids are being replaced."""
        return self.key is not None

    def tenant(self, tenant_id: str | None) -> str | None:
        """The pseudonym of an identifier field (unchanged when not redacting)."""
        if tenant_id is None or self.key is None:
            return tenant_id
        return self._map.get(tenant_id) or pseudonym(tenant_id, self.key)

    def text(self, text: str | None) -> str | None:
        """Free text with every known tenant id replaced by its pseudonym."""
        if text is None or self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._map[m.group(1)], text)
