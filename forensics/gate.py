"""Before deploy: check a fleet of engines against the context the platform advertises.

The incident's configuration half: a prefill KV pool smaller than the advertised context pulls
the engine's input limit (``max_req_input_len``) below it, and prompts between the two reach a
rejection path that a PD deployment of an affected release does not honour. The pool is sized
at start-up from the memory left after the weights, so the check must read the running engine
(its ``/get_server_info``), not a configuration file.

Per node the gate checks what the incident broke:

- ``limit`` (prefill and unified nodes): the limit, as reported or implied by the pool in whole
  pages (the smaller when both are known), reaches the normal ceiling for the advertised
  context, ``context - 6``.
- ``decode_pool`` (decode nodes): the pool holds a prompt at that ceiling in whole pages.
- ``roles``, ``page_size``, ``chunked_prefill``, ``context_length``: the fleet agrees (unified
  and PD nodes are not mixed; one page size; one chunked-prefill size among the nodes that
  prefill; one context length). A node that differs from the majority fails, naming what the
  rest use; with no majority every node fails.
- ``version``: the engine release is in no range of the known-bad list
  (``forensics/data/known_bad_engines.toml``, data rather than code).

A source that cannot be read fails with the reason (timeout, refused, HTTP status, not JSON).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.detect import default_threshold
from forensics.endpoint import get_json, is_url, join, parse_object
from forensics.errors import ForensicsError

KNOWN_BAD_PATH = Path(__file__).resolve().parent / "data" / "known_bad_engines.toml"
DEFAULT_TIMEOUT = 10.0
# Reads run side by side so that a few dead endpoints cost one timeout, not one each.
_READERS = 8
# SGLang's server arguments default the page size to one token.
_DEFAULT_PAGE = 1
ROLES = {"prefill": "prefill", "decode": "decode", "null": "unified", None: "unified"}
# The engine whose /get_server_info the gate reads; the known-bad list names engines so it can
# hold others' ranges too.
ENGINE = "sglang"


# --- the known-bad list ---------------------------------------------------------------------

_VERSION = re.compile(
    r"v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|rc|alpha|beta|c)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?post[-_.]?(?P<post>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
    r"(?:\+[a-z0-9.]+)?",
    re.IGNORECASE,
)
_PHASE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}


def version_key(text: str) -> tuple:
    """A sort key for an engine release: release numbers, then pre-releases (a, b, rc) before
    the release, ``.postN`` after it, ``.devN`` before everything of its release.

    >>> version_key("0.5.22rc1") < version_key("0.5.22") < version_key("0.5.22.post1")
    True
    >>> version_key("0.5.21.post2") < version_key("0.5.22.dev0") < version_key("0.5.22a0")
    True

    Raises:
        ValueError: the text is no release number.
    """
    match = _VERSION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not a release number: {text!r}")
    release = [int(p) for p in match["release"].split(".")]
    while release and release[-1] == 0:
        release.pop()  # 0.5 and 0.5.0 are one release
    pre, dev, post = match["pre"], match["dev"], match["post"]
    if pre is not None:
        phase, pre_n = _PHASE[pre.lower()], int(match["pre_n"] or 0)
    else:
        phase, pre_n = (-1 if dev is not None and post is None else 3), 0
    return (
        tuple(release),
        phase,
        pre_n,
        int(post or 0) if post is not None else -1,
        int(dev or 0) if dev is not None else math.inf,
    )


@dataclass(frozen=True)
class BadRange:
    """Releases of one engine that admit rejected prompts: ``introduced`` <= v < ``fixed``."""

    engine: str
    id: str
    introduced: str
    fixed: str | None
    summary: str
    references: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()  # the node roles affected; empty: every role

    def contains(self, version: str) -> bool:
        key = version_key(version)
        if key < version_key(self.introduced):
            return False
        return self.fixed is None or key < version_key(self.fixed)

    def describe(self) -> str:
        """The range as a reader writes it.

        >>> BadRange("sglang", "x", "0", "0.5.22", "").describe()
        '< 0.5.22'
        """
        low = "" if version_key(self.introduced) == version_key("0") else f">= {self.introduced}"
        high = f"< {self.fixed}" if self.fixed else "every release so far"
        return ", ".join(p for p in (low, high) if p)


@dataclass(frozen=True)
class KnownBad:
    """The known-bad list: where it was read from, when it was last updated, its ranges."""

    path: Path
    updated: str
    ranges: tuple[BadRange, ...]

    def match(self, engine: str, version: str, role: str | None = None) -> BadRange | None:
        """The first range holding this release of this engine, for a node of this role."""
        for bad in self.ranges:
            if bad.engine != engine or (bad.roles and role not in bad.roles):
                continue
            if bad.contains(version):
                return bad
        return None


def load_known_bad(path: Path | None = None) -> KnownBad:
    """Read the known-bad list (the packaged one unless ``path`` is given).

    >>> load_known_bad().match("sglang", "0.5.11", "prefill").id
    'pd-rejected-prompt-admitted'

    Raises:
        ForensicsError: the file cannot be read or breaks the format; the message names the
            file and the key.
    """
    import tomllib

    path = path or KNOWN_BAD_PATH
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ForensicsError(f"{path}: cannot read the known-bad list ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ForensicsError(f"{path}: not valid TOML ({exc})") from None
    ranges = []
    for number, entry in enumerate(data.get("range", []), start=1):
        where = f"{path}: [[range]] {number}"
        values = {}
        for key in ("engine", "id", "introduced", "summary"):
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise ForensicsError(f"{where}: `{key}` must be a non-empty string")
            values[key] = entry[key].strip()
        fixed = entry.get("fixed")
        if fixed is not None and not isinstance(fixed, str):
            raise ForensicsError(f"{where}: `fixed` must be a string")
        for key, value in (("introduced", values["introduced"]), ("fixed", fixed)):
            if value is not None:
                try:
                    version_key(value)
                except ValueError:
                    raise ForensicsError(f"{where}: `{key}` {value!r} is no release") from None
        refs = entry.get("references", [])
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise ForensicsError(f"{where}: `references` must be a list of strings")
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or not set(roles) <= set(ROLES.values()):
            raise ForensicsError(
                f"{where}: `roles` must be a list of {', '.join(sorted(set(ROLES.values())))}"
            )
        ranges.append(BadRange(fixed=fixed, references=tuple(refs), roles=tuple(roles), **values))
    return KnownBad(path=path, updated=str(data.get("updated", "unknown")), ranges=tuple(ranges))


# --- nodes and checks -----------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One check of one node: its name, whether it passed, and why in one sentence."""

    name: str
    passed: bool
    why: str


@dataclass
class Node:
    """One SOURCE: what its server_info says and how it fared."""

    source: str
    error: str | None = None
    role: str | None = None
    version: str | None = None
    context_length: int | None = None
    max_total_num_tokens: int | None = None
    max_req_input_len: int | None = None
    page_size: int | None = None
    chunked_prefill_size: int | None = None
    limit: int | None = None  # the limit judged: reported, else implied by the pool
    ceiling: int | None = None  # the normal limit for the advertised context
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)

    def check(self, name: str, passed: bool, why: str) -> None:
        self.checks.append(Check(name, passed, why))


@dataclass
class GateReport:
    """The gate's verdict on a fleet."""

    nodes: list[Node]
    context_length: int | None  # the advertised context; None: each engine's own
    known_bad: KnownBad

    @property
    def passed(self) -> bool:
        return bool(self.nodes) and all(n.passed for n in self.nodes)

    def failed(self) -> list[Node]:
        return [n for n in self.nodes if not n.passed]

    def to_json(self) -> dict[str, Any]:
        """The report for a pipeline: every key always present, null where unknown."""
        return {
            "passed": self.passed,
            "context_length": self.context_length,
            "known_bad_list": {
                "path": str(self.known_bad.path),
                "updated": self.known_bad.updated,
            },
            "nodes": [
                {
                    "source": n.source,
                    "passed": n.passed,
                    "error": n.error,
                    "role": n.role,
                    "version": n.version,
                    "context_length": n.context_length,
                    "max_total_num_tokens": n.max_total_num_tokens,
                    "max_req_input_len": n.max_req_input_len,
                    "page_size": n.page_size,
                    "chunked_prefill_size": n.chunked_prefill_size,
                    "limit": n.limit,
                    "ceiling": n.ceiling,
                    "checks": [
                        {"check": c.name, "passed": c.passed, "why": c.why} for c in n.checks
                    ],
                }
                for n in self.nodes
            ],
        }


class _BadDocument(ValueError):
    """A server_info field of the wrong type: the node cannot be judged."""


def read_source(source: str, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """An engine's server_info: live from ``<base URL>/get_server_info``, or a saved file.

    Raises:
        ForensicsError: unreachable, not 200, unreadable or not a JSON object; the message
            names the URL or file.
    """
    if is_url(source):
        return get_json(join(source, "/get_server_info"), timeout)
    try:
        body = Path(source).read_bytes()
    except OSError as exc:
        raise ForensicsError(f"{source}: cannot read the file ({exc.strerror})") from None
    return parse_object(body, source)


def _field(doc: dict[str, Any], key: str) -> Any:
    # Builds that leave a scheduler value out of the top level still report it per
    # data-parallel rank under internal_states.
    if key in doc:
        return doc[key]
    states = doc.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return states[0].get(key)
    return None


def _int(doc: dict[str, Any], key: str, *, least: int = 1) -> int | None:
    value = _field(doc, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadDocument(f"{key} is not an integer: {value!r}")
    if value < least and not (key == "chunked_prefill_size" and value == -1):
        # -1 is how SGLang says chunked prefill is off.
        raise _BadDocument(f"{key} is out of range: {value!r}")
    return value


def describe_node(source: str, doc: dict[str, Any]) -> Node:
    """The fields of one server_info document the checks read, typed.

    Raises:
        _BadDocument: a field is present with the wrong type or value.
    """
    mode = doc.get("disaggregation_mode")
    if mode not in ROLES:
        raise _BadDocument(f"disaggregation_mode is not prefill, decode or null: {mode!r}")
    version = doc.get("version")
    if version is not None and not isinstance(version, str):
        raise _BadDocument(f"version is not a string: {version!r}")
    return Node(
        source=source,
        role=ROLES[mode],
        version=version,
        context_length=_int(doc, "context_length"),
        max_total_num_tokens=_int(doc, "max_total_num_tokens"),
        max_req_input_len=_int(doc, "max_req_input_len"),
        page_size=_int(doc, "page_size"),
        chunked_prefill_size=_int(doc, "chunked_prefill_size"),
    )


def _ceiling(node: Node, advertised: int | None, check: str) -> int | None:
    """Set the node's normal ceiling, ``context - 6`` (SGLang's limit for a pool at least as
    large as the context); the context it rests on, or None after failing ``check``."""
    context = advertised or node.context_length
    if context is None:
        node.check(
            check,
            False,
            "no context length to check against: the engine reports none; pass --context-length",
        )
        return None
    node.ceiling = default_threshold(context, context)
    return context


def check_limit(node: Node, advertised: int | None) -> None:
    """Prefill and unified nodes: the input limit reaches ``context - 6``."""
    context = _ceiling(node, advertised, "limit")
    if context is None or node.ceiling is None:  # _ceiling sets both or neither
        return
    page = node.page_size or _DEFAULT_PAGE
    pool = node.max_total_num_tokens
    candidates = []
    if node.max_req_input_len is not None:
        candidates.append((node.max_req_input_len, "max_req_input_len"))
    if pool is not None:
        # What the engine derives from its pool, counting whole pages only. The smaller of
        # the two binds: a prompt the limit lets in still has to fit the pool.
        implied = default_threshold(pool // page * page, node.context_length or context)
        candidates.append(
            (implied, f"the limit implied by the pool ({pool:,} tokens, page {page})")
        )
    if not candidates:
        node.check("limit", False, "reports neither max_req_input_len nor max_total_num_tokens")
        return
    node.limit, said = min(candidates, key=lambda c: c[0])
    if node.limit >= node.ceiling:
        node.check(
            "limit",
            True,
            f"{said} {node.limit:,} reaches {node.ceiling:,}, "
            f"the normal ceiling for context {context:,}",
        )
        return
    if pool is not None and default_threshold(pool, context) < node.ceiling:
        cause = f"the KV pool of {pool:,} tokens is smaller than the context and pulls it down"
    elif node.context_length is not None and node.context_length < context:
        cause = f"the engine's own context_length {node.context_length:,} is below it"
    else:
        cause = "the engine keeps a lower limit than its pool and context give"
    node.check(
        "limit",
        False,
        f"{said} {node.limit:,} is below {node.ceiling:,}, the normal ceiling for context "
        f"{context:,}: {cause}; prompts of {node.limit:,} to {context - 1:,} tokens reach the "
        "rejection path",
    )


def check_decode_pool(node: Node, advertised: int | None) -> None:
    """Decode nodes: the pool holds a prompt at the normal ceiling, in whole pages."""
    context = _ceiling(node, advertised, "decode_pool")
    if context is None or node.ceiling is None:  # _ceiling sets both or neither
        return
    pool = node.max_total_num_tokens
    if pool is None:
        node.check("decode_pool", False, "reports no max_total_num_tokens (its KV pool)")
        return
    page = node.page_size or _DEFAULT_PAGE
    need, have = -(-node.ceiling // page), pool // page
    pages = f"{need:,} pages of {page} needed, {have:,} in the pool"
    if have >= need:
        node.check(
            "decode_pool",
            True,
            f"the pool of {pool:,} tokens holds a {node.ceiling:,}-token prompt ({pages})",
        )
    else:
        node.check(
            "decode_pool",
            False,
            f"the pool of {pool:,} tokens cannot hold a {node.ceiling:,}-token prompt "
            f"({pages}): decode refuses prompts the context allows",
        )


def check_version(node: Node, known_bad: KnownBad) -> None:
    """The release is in no known-bad range (a node that does not say fails: fail closed)."""
    if not node.version:
        node.check(
            "version",
            False,
            "reports no engine version: it cannot be checked against the known-bad list",
        )
        return
    try:
        bad = known_bad.match(ENGINE, node.version, node.role)
    except ValueError:
        node.check(
            "version",
            False,
            f"engine version {node.version!r} is no release number the known-bad list can "
            "be checked against",
        )
        return
    if bad is None:
        node.check(
            "version",
            True,
            f"{ENGINE} {node.version} is in no known-bad range for a {node.role} node "
            f"(list updated {known_bad.updated})",
        )
        return
    upgrade = f"; run {bad.fixed} or later" if bad.fixed else "; no fixed release yet"
    node.check(
        "version",
        False,
        f"{ENGINE} {node.version} is in the known-bad range {bad.describe()} ({bad.id}): "
        f"it admits prompts it rejected{upgrade}",
    )


def check_agreement(
    nodes: Sequence[Node],
    name: str,
    value: Callable[[Node], Any],
    applies: Callable[[Node], bool] = lambda n: True,
) -> None:
    """One setting agrees across the nodes it applies to (those that report it).

    A node that differs from the majority fails and is told what the rest use; when no value
    has a majority, which side is wrong cannot be told, and every node fails.
    """
    seen = {id(n): value(n) for n in nodes if applies(n) and value(n) is not None}
    if not seen:
        return
    counts = Counter(seen.values())
    ranked = counts.most_common()
    majority = ranked[0][0] if len(ranked) == 1 or ranked[0][1] > ranked[1][1] else None
    spread = "; ".join(
        f"{_show(v)} on {', '.join(n.source for n in nodes if seen.get(id(n), object()) == v)}"
        for v, _ in ranked
    )
    for node in nodes:
        if id(node) not in seen:
            continue
        value_here = seen[id(node)]
        mine = _show(value_here)
        if len(counts) == 1:
            node.check(name, True, f"{name} {mine} on {_all(len(seen))}")
        elif majority is None:
            node.check(
                name, False, f"{name} {mine}: the fleet disagrees with no majority: {spread}"
            )
        elif value_here == majority:
            node.check(name, True, f"{name} {mine}, as on {counts[majority]} of {len(seen)} nodes")
        else:
            node.check(
                name,
                False,
                f"{name} {mine}, where {counts[majority]} of {len(seen)} nodes use "
                f"{_show(majority)}",
            )


def _show(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _all(count: int) -> str:
    return "the only node that reports it" if count == 1 else f"all {count} nodes that report it"


def judge(
    docs: Sequence[tuple[str, dict[str, Any] | str]],
    context_length: int | None = None,
    known_bad: KnownBad | None = None,
) -> GateReport:
    """Judge a fleet from its server_info documents.

    Args:
        docs: per SOURCE, its document, or the reason it could not be read (a string).
        context_length: the context the platform advertises; None checks each engine
            against its own ``context_length``.
        known_bad: the known-bad list (default: the packaged one).
    """
    known_bad = known_bad or load_known_bad()
    nodes: list[Node] = []
    for source, doc in docs:
        if isinstance(doc, str):
            node = Node(source=source, error=doc)
            node.check("read", False, doc)
            nodes.append(node)
            continue
        try:
            node = describe_node(source, doc)
        except _BadDocument as exc:
            node = Node(source=source, error=str(exc))
            node.check("read", False, f"server_info is not usable: {exc}")
            nodes.append(node)
            continue
        if node.role == "decode":
            check_decode_pool(node, context_length)
        else:
            check_limit(node, context_length)
        nodes.append(node)
    live = [n for n in nodes if n.error is None]
    check_agreement(live, "roles", lambda n: "unified" if n.role == "unified" else "PD")
    check_agreement(live, "page_size", lambda n: n.page_size or _DEFAULT_PAGE)
    check_agreement(
        live,
        "chunked_prefill",
        lambda n: n.chunked_prefill_size,
        applies=lambda n: n.role != "decode",  # decode nodes do not prefill prompts
    )
    check_agreement(live, "context_length", lambda n: n.context_length)
    for node in live:
        check_version(node, known_bad)
    return GateReport(nodes=nodes, context_length=context_length, known_bad=known_bad)


def gate(
    sources: Sequence[str],
    context_length: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    known_bad: KnownBad | None = None,
) -> GateReport:
    """Read every SOURCE (base URLs live, with ``timeout``; saved files) and judge the fleet.

    A source that cannot be read becomes a failing node naming the reason; the gate itself
    only raises for a known-bad list it cannot read.
    """
    from concurrent.futures import ThreadPoolExecutor

    known_bad = known_bad or load_known_bad()

    def read(source: str) -> dict[str, Any] | str:
        try:
            return read_source(source, timeout)
        except ForensicsError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=min(_READERS, max(1, len(sources)))) as pool:
        docs = list(zip(sources, pool.map(read, sources), strict=True))
    return judge(docs, context_length=context_length, known_bad=known_bad)
