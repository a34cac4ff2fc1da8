"""Every hour: marker prompts around the input limit against a live OpenAI-compatible server.

The incident gave clients HTTP 200 and a fluent answer built from other requests' KV, so a
status-code check cannot see it; the content can. Each canary prompt carries a unique random
marker and asks for it back. Prompts straddle the limit (just under, at, just over, near the
context length) among ordinary lengths, interleaved so that every long prompt follows shorter
ones whose KV it could read, and are sent one at a time at a bounded rate. Then:

- a reply holding any marker but its own is a cross-request **leak** (both requests named);
- a prompt at or over the limit answered 2xx, rather than refused with a 4xx, is the
  incident's admission failure;
- a time to first token far too short for the prompt's length is judged by the case
  detector ``latency_too_good`` itself, run over the canary's own records.

Prompt sizes are in the endpoint's own tokens: with no tokenizer at hand, two short calibration
prompts measure, through the ``usage.prompt_tokens`` the endpoint reports, what the chat
template adds and what one filler word costs. Verdicts use the size the endpoint reports
whenever it answers. Every request is written as canonical ``requests`` evidence, so a canary
run can be ingested into a case.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from forensics.endpoint import (
    USER_AGENT,
    EndpointError,
    describe,
    get_json,
    join,
    open_url,
    parse_object,
    quote,
    read_body,
    read_errors,
)
from forensics.errors import ForensicsError

CHAT_PATH = "/v1/chat/completions"
TENANT = "canary"  # the tenant_id of canary records in a case
MAX_REQUESTS = 64
MIN_REQUESTS = 10  # two calibration, four straddling, each after an ordinary one
MAX_RATE = 20.0  # requests per second, at most: the canary must never load a fleet
REPLY_TOKENS = 48  # room to echo a marker (its own or, after a leak, another's)
# A marker: unique per request, unlikely in any text but ours, easy to find in a reply.
MARKER = re.compile(r"kvcanary-[0-9a-f]{16}")
# One filler word: short, common, one token in the usual tokenizers; calibration measures it.
FILLER = " the"
CALIBRATION_WORDS = (16, 144)
# The calibration prompts and the shortest ordinary ones must fit well under the limit.
MIN_LIMIT = 512
# The near-context prompt leaves room for the reply and the template within the window.
NEAR_CONTEXT_MARGIN = REPLY_TOKENS + 16
# Which detector judges the TTFT, and what the canary changes in it: it sends one prompt per
# length, not a crowd, so a bin of one request enters the fit; and its lengths are scaled to
# the limit, so the floors below which the detector neither fits nor judges come down to the
# canary's own shortest ordinary prompt and half the limit when those are smaller.
TTFT_DETECTOR = "latency_too_good"


@dataclass
class Probe:
    """One canary request: what was sent and what came back."""

    request_id: str
    kind: str
    target_tokens: int
    marker: str
    words: int
    received_at: datetime | None = None
    http_status: int | None = None
    prompt_tokens: int | None = None  # as the endpoint reported it (usage)
    completion_tokens: int | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    finish_reason: str | None = None
    response_id: str | None = None
    reply: str = ""
    error: str | None = None
    markers_seen: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """The prompt's size: as reported when it was, else as planned."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.target_tokens

    @property
    def answered(self) -> bool:
        return self.http_status is not None and 200 <= self.http_status < 300 and not self.error

    def record(self, model: str) -> dict[str, Any]:
        """The canonical ``requests`` row (unknown columns land in the case's ``extra``)."""
        first = completed = None
        if self.received_at is not None and self.ttft_ms is not None:
            first = self.received_at + timedelta(milliseconds=self.ttft_ms)
        if self.received_at is not None and self.e2e_ms is not None:
            completed = self.received_at + timedelta(milliseconds=self.e2e_ms)
        return {
            "request_id": self.request_id,
            "tenant_id": TENANT,
            "received_at": _iso(self.received_at),
            "prompt_tokens": self.tokens,
            "http_status": self.http_status,
            "completion_tokens": self.completion_tokens,
            "first_token_at": _iso(first),
            "completed_at": _iso(completed),
            "ttft_ms": self.ttft_ms,
            "e2e_ms": self.e2e_ms,
            "finish_reason": self.finish_reason,
            "model": model,
            "user_agent": USER_AGENT,
            "canary_kind": self.kind,
            "target_tokens": self.target_tokens,
            "filler_words": self.words,
            "prompt_tokens_reported": self.prompt_tokens is not None,
            "marker": self.marker,
            "markers_seen": self.markers_seen,
            "response_id": self.response_id,
            "error": self.error,
            "reply": self.reply,
        }


@dataclass(frozen=True)
class Leak:
    """A reply holding another request's marker. ``source`` is None when the marker is not one
    this run sent (an earlier canary run's KV)."""

    recipient: Probe
    source: Probe | None
    marker: str


@dataclass
class CanaryReport:
    """What a canary run found."""

    base_url: str
    model: str
    limit_tokens: int
    limit_source: str  # "--limit-tokens" or "/get_server_info"
    context_length: int | None
    probes: list[Probe]
    leaks: list[Leak] = field(default_factory=list)
    over_limit_answered: list[Probe] = field(default_factory=list)
    ttft_flagged: list[tuple[Probe, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    records: Path | None = None

    @property
    def passed(self) -> bool:
        return not self.leaks and not self.over_limit_answered

    def outcome(self, probe: Probe) -> str:
        """One word or phrase per request for the table."""
        parts = []
        for leak in self.leaks:
            if leak.recipient is probe:
                parts.append(f"LEAK from {leak.source.request_id if leak.source else 'elsewhere'}")
        if probe in self.over_limit_answered:
            parts.append("answered over the limit")
        if any(p is probe for p, _ in self.ttft_flagged):
            parts.append("TTFT too fast")
        if parts:
            return "; ".join(parts)
        if probe.answered:
            return "answered"
        if probe.http_status is not None and 200 <= probe.http_status < 300:
            return "error in the stream"
        return f"refused (HTTP {probe.http_status})"

    def to_json(self) -> dict[str, Any]:
        """The run for scripts: every key always present, null where unknown."""
        return {
            "passed": self.passed,
            "base_url": self.base_url,
            "model": self.model,
            "limit_tokens": self.limit_tokens,
            "limit_source": self.limit_source,
            "context_length": self.context_length,
            "records": str(self.records) if self.records else None,
            "leaks": [
                {
                    "recipient": leak.recipient.request_id,
                    "source": leak.source.request_id if leak.source else None,
                    "marker": leak.marker,
                }
                for leak in self.leaks
            ],
            "over_limit_answered": [p.request_id for p in self.over_limit_answered],
            "ttft_flagged": [
                {"request_id": p.request_id, "detail": d} for p, d in self.ttft_flagged
            ],
            "warnings": self.warnings,
            "requests": [
                {
                    "request_id": p.request_id,
                    "kind": p.kind,
                    "target_tokens": p.target_tokens,
                    "prompt_tokens": p.prompt_tokens,
                    "http_status": p.http_status,
                    "ttft_ms": p.ttft_ms,
                    "outcome": self.outcome(p),
                }
                for p in self.probes
            ],
        }


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


# --- planning -------------------------------------------------------------------------------


def plan_targets(count: int, limit: int, context: int | None) -> list[tuple[str, int]]:
    """The prompt sizes after calibration, in the order they are sent: each straddling prompt
    follows an ordinary one, so its stale pages (if any) hold a marker.

    >>> [k for k, _ in plan_targets(10, 2000, 4096)]
    ['ordinary', 'under', 'ordinary', 'at', 'ordinary', 'over', 'ordinary', 'near_context']
    >>> plan_targets(10, 2000, 4096)[1:6:2]
    [('under', 1999), ('at', 2000), ('over', 2001)]
    """
    straddle = [("under", limit - 1), ("at", limit), ("over", limit + 1)]
    if context is not None:
        near = context - NEAR_CONTEXT_MARGIN
        if all(abs(near - size) > NEAR_CONTEXT_MARGIN for _, size in straddle) and near > 0:
            straddle.append(("near_context", near))
    ordinary_count = count - len(CALIBRATION_WORDS) - len(straddle)
    # Ordinary lengths spread evenly in log scale, from a short chat to half the limit.
    low = max(64, min(256, limit // 32))
    high = max(low + 1, limit // 2)
    sizes = [
        round(low * (high / low) ** (i / max(1, ordinary_count - 1))) for i in range(ordinary_count)
    ]
    plan: list[tuple[str, int]] = []
    for i, size in enumerate(sizes):
        plan.append(("ordinary", size))
        if i < len(straddle):
            plan.append(straddle[i])
    plan += straddle[len(sizes) :]
    return plan


def prompt(marker: str, words: int) -> str:
    """The canary prompt: the marker, the request to echo it, then filler words.

    >>> prompt("kvcanary-0123456789abcdef", 2)
    'Canary kvcanary-0123456789abcdef. Reply with this canary code, exactly, and stop. the the'
    """
    return f"Canary {marker}. Reply with this canary code, exactly, and stop." + FILLER * words


@dataclass(frozen=True)
class Sizing:
    """Prompt tokens = ``overhead`` + ``per_word`` x filler words, as the endpoint counts."""

    overhead: float
    per_word: float

    def words(self, target: int, kind: str) -> int:
        """Filler words for a target size: never over the target below the limit, never under
        it at or over the limit (a calibration that is off by a token must not turn an "over"
        prompt into an "at" one)."""
        exact = (target - self.overhead) / self.per_word
        rounded = math.floor(exact) if kind in ("ordinary", "under") else math.ceil(exact)
        return max(0, rounded)


# --- talking to the endpoint ----------------------------------------------------------------


def send(base_url: str, model: str, probe: Probe, timeout: float) -> None:
    """Send one streamed chat completion and fill ``probe`` with what came back.

    Refusals (any non-2xx) are recorded, not raised.

    Raises:
        EndpointError: no answer (timeout, refused connection) or a 2xx body that is not a
            chat completion stream.
    """
    url = join(base_url, CHAT_PATH)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt(probe.marker, probe.words)}],
        "max_tokens": REPLY_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    probe.received_at = datetime.now(UTC)
    start = time.monotonic()
    response = open_url(url, timeout, body)
    probe.http_status = response.status
    if not 200 <= response.status < 300:
        text = read_body(response, url, timeout)
        probe.e2e_ms = (time.monotonic() - start) * 1000
        probe.error = _error_message(text) or f"HTTP {response.status}"
        return
    parts: list[str] = []
    try:
        for event in _events(response, url):
            if isinstance(event.get("error"), dict | str):
                # Some servers report a failure inside a 200 stream.
                error = event["error"]
                message = error.get("message") if isinstance(error, dict) else error
                probe.error = message if isinstance(message, str) else json.dumps(error)
                continue
            if isinstance(event.get("id"), str):
                probe.response_id = probe.response_id or event["id"]
            choices = event.get("choices")
            for choice in choices if isinstance(choices, list) else []:
                if not isinstance(choice, dict):
                    continue
                piece = _choice_text(choice)
                if piece and probe.ttft_ms is None:
                    probe.ttft_ms = (time.monotonic() - start) * 1000
                parts.append(piece)
                if isinstance(choice.get("finish_reason"), str):
                    probe.finish_reason = choice["finish_reason"]
            usage = event.get("usage")
            if isinstance(usage, dict):
                probe.prompt_tokens = _count(usage.get("prompt_tokens"))
                probe.completion_tokens = _count(usage.get("completion_tokens"))
    except read_errors() as exc:
        raise EndpointError(url, describe(exc, timeout)) from None
    finally:
        response.close()
    probe.e2e_ms = (time.monotonic() - start) * 1000
    probe.reply = "".join(parts)
    probe.markers_seen = sorted(set(MARKER.findall(probe.reply)))


def _choice_text(choice: dict[str, Any]) -> str:
    """The text one streamed choice carries. A reasoning model streams its thinking first:
    that is its first token, and a foreign marker can show there as well as in the answer."""
    delta = choice.get("delta") or choice.get("message") or {}
    if not isinstance(delta, dict):
        return ""
    parts = (delta.get("reasoning_content"), delta.get("content"))
    return "".join(p for p in parts if isinstance(p, str))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _error_message(body: bytes) -> str | None:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return quote(body)
    if isinstance(value, dict):
        inner: dict[str, Any] = value["error"] if isinstance(value.get("error"), dict) else value
        message = inner.get("message") or inner.get("detail")
        if isinstance(message, str):
            return message
    return quote(body)


def _events(response, url: str):
    """The JSON events of a server-sent event stream (``data: {...}`` lines, up to
    ``[DONE]``); a plain JSON body (a server that ignores ``stream``) is one event."""
    first = True
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line or line.startswith(":"):
            continue
        if first and line.startswith("{"):
            yield parse_object(line.encode() + response.read(), url)
            return
        first = False
        if not line.startswith("data:"):
            raise EndpointError(url, f"not a chat completion stream ({quote(raw)})")
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        yield parse_object(data.encode(), url)


# --- the run --------------------------------------------------------------------------------


def resolve_limits(
    base_url: str, limit_tokens: int | None, context_length: int | None, timeout: float
) -> tuple[int, str, int | None]:
    """The limit to straddle, where it came from, and the context length (None if unknown).

    ``/get_server_info`` is read only for what the options leave open; when the limit is
    given, an endpoint without it (a gateway) only costs the near-context prompt.

    Raises:
        ForensicsError: no limit given and none readable from the endpoint.
    """
    if limit_tokens is not None and context_length is not None:
        return limit_tokens, "--limit-tokens", context_length
    url = join(base_url, "/get_server_info")
    try:
        info = get_json(url, timeout)
    except EndpointError:
        if limit_tokens is None:
            raise
        return limit_tokens, "--limit-tokens", None
    context = context_length if context_length is not None else _count(info.get("context_length"))
    if limit_tokens is not None:
        return limit_tokens, "--limit-tokens", context
    limit = _count(info.get("max_req_input_len"))
    if not limit:
        raise EndpointError(url, "reports no max_req_input_len; give the limit with --limit-tokens")
    if limit < MIN_LIMIT:
        raise EndpointError(
            url,
            f"max_req_input_len {limit:,} is too small to straddle "
            f"(the canary needs at least {MIN_LIMIT:,} tokens)",
        )
    return limit, "/get_server_info", context


def calibrate(
    base_url: str,
    model: str,
    run_id: str,
    timeout: float,
    pace: Callable[[], None],
    sent: list[Probe],
) -> Sizing:
    """Two short prompts whose reported sizes give the endpoint's token cost of a prompt.
    Each is added to ``sent`` once it has been answered, whatever the answer.

    Raises:
        ForensicsError: a calibration prompt was not answered, or without usage.
    """
    probes: list[Probe] = []
    for words in CALIBRATION_WORDS:
        probe = Probe(f"{run_id}-{len(sent) + 1:02d}", "calibration", 0, _marker(), words)
        pace()
        send(base_url, model, probe, timeout)
        sent.append(probe)
        url = join(base_url, CHAT_PATH)
        if not probe.answered:
            status = f"HTTP {probe.http_status}" if probe.http_status else "no answer"
            raise EndpointError(
                url, f"a {words}-word calibration prompt was not answered ({status}: {probe.error})"
            )
        if probe.prompt_tokens is None:
            raise EndpointError(
                url, "reports no usage.prompt_tokens, so prompts cannot be sized in its tokens"
            )
        probe.target_tokens = probe.prompt_tokens
        probes.append(probe)
    (w1, t1), (w2, t2) = ((p.words, p.prompt_tokens) for p in probes)
    assert t1 is not None and t2 is not None  # a probe without usage has raised above
    per_word = (t2 - t1) / (w2 - w1)
    if per_word <= 0:
        raise EndpointError(
            join(base_url, CHAT_PATH),
            f"prompt_tokens did not grow with the prompt ({t1} then {t2}); cannot size prompts",
        )
    return Sizing(overhead=t1 - w1 * per_word, per_word=per_word)


def _marker() -> str:
    return f"kvcanary-{secrets.token_hex(8)}"


class _Pacer:
    """Spaces request starts at least ``1 / rate`` seconds apart."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self.last: float | None = None

    def __call__(self) -> None:
        if self.last is not None:
            time.sleep(max(0.0, self.last + self.interval - time.monotonic()))
        self.last = time.monotonic()


def run_canary(
    base_url: str,
    model: str,
    *,
    requests: int = 12,
    limit_tokens: int | None = None,
    context_length: int | None = None,
    out: Path | None = None,
    rate: float = 1.0,
    timeout: float = 300.0,
    now: datetime | None = None,
) -> CanaryReport:
    """Send the canary prompts, judge the replies, and write the records under ``out``.

    Args:
        base_url: the server root (``http://host:port``).
        model: the model name the endpoint serves.
        requests: how many prompts in all, calibration included (10 to 64).
        limit_tokens: the input limit to straddle (default: ``max_req_input_len`` from
            ``/get_server_info``).
        context_length: the advertised context (default: the endpoint's ``context_length``).
        out: the folder for the records (``<run id>.jsonl``, the run id being
            ``canary-<UTC time>-<random>``); None writes none.
        rate: requests started per second, at most (up to 20).
        timeout: seconds to wait for each answer.
        now: the run's time, for its id and file name (default: the clock).

    Raises:
        ForensicsError: the endpoint could not be reached, calibrated or read (one line naming
            it). Records gathered before the failure are written first.
        ValueError: ``requests``, ``rate`` or ``limit_tokens`` out of bounds.
    """
    if not MIN_REQUESTS <= requests <= MAX_REQUESTS:
        raise ValueError(f"requests must be {MIN_REQUESTS} to {MAX_REQUESTS}")
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"rate must be above 0 and at most {MAX_RATE:g} per second")
    if limit_tokens is not None and limit_tokens < MIN_LIMIT:
        raise ValueError(f"limit_tokens must be at least {MIN_LIMIT}")
    if out is not None:
        from forensics.files import private_dirs

        private_dirs(out)  # a folder that cannot be made fails before any prompt is sent
    started = (now or datetime.now(UTC)).astimezone(UTC)
    run_id = "canary-" + started.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
    limit, limit_source, context = resolve_limits(base_url, limit_tokens, context_length, timeout)
    report = CanaryReport(base_url, model, limit, limit_source, context, probes=[])
    pace = _Pacer(rate)
    try:
        sizing = calibrate(base_url, model, run_id, timeout, pace, report.probes)
        for kind, target in plan_targets(requests, limit, context):
            number = len(report.probes) + 1
            probe = Probe(f"{run_id}-{number:02d}", kind, target, _marker(), 0)
            probe.words = sizing.words(target, kind)
            pace()
            send(base_url, model, probe, timeout)
            report.probes.append(probe)
    finally:
        if out is not None and report.probes:
            report.records = write_records(out / f"{run_id}.jsonl", report.probes, model)
    judge(report)
    if context is None:
        report.warnings.append(
            "no context length known (the endpoint reports none and --context-length was not "
            "given): the near-context prompt was not sent"
        )
    return report


def judge(report: CanaryReport) -> None:
    """Find leaks, over-limit prompts answered, refusals below the limit and impossible TTFTs."""
    by_marker = {p.marker: p for p in report.probes}
    for probe in report.probes:
        for marker in sorted(set(MARKER.findall(probe.reply))):
            if marker != probe.marker:
                report.leaks.append(Leak(probe, by_marker.get(marker), marker))
        if probe.answered and probe.tokens >= report.limit_tokens:
            report.over_limit_answered.append(probe)
        elif probe.error and probe.http_status is not None and 200 <= probe.http_status < 300:
            # Nothing was answered, but a client that checks the status saw success.
            report.warnings.append(
                f"{probe.request_id} ({probe.kind}, {probe.tokens:,} tokens) was refused inside "
                f"an HTTP {probe.http_status} stream rather than with a 4xx: {probe.error}"
            )
        elif not probe.answered and probe.tokens < report.limit_tokens:
            report.warnings.append(
                f"{probe.request_id} ({probe.kind}, {probe.tokens:,} tokens, under the limit of "
                f"{report.limit_tokens:,}) was not answered: HTTP {probe.http_status}: "
                f"{probe.error}"
            )
    report.ttft_flagged = judge_ttft(report)


def judge_ttft(report: CanaryReport) -> list[tuple[Probe, str]]:
    """Run the case detector ``latency_too_good`` over the canary's records.

    The prompts already known bad (answered over the limit, or leaking) stand where the case's
    other detectors' hits stand: out of the expected-TTFT fit.
    """
    from forensics.db import connect, insert_rows
    from forensics.detect import prepare, run_detector
    from forensics.detectors import load_detectors

    detector = next(d for d in load_detectors() if d.id == TTFT_DETECTOR)
    ordinary = [p.tokens for p in report.probes if p.kind == "ordinary"]
    params = detector.defaults()
    params["min_bin_requests"] = 1
    if ordinary:
        params["fit_min_prompt_tokens"] = min(params["fit_min_prompt_tokens"], min(ordinary))
    params["min_prompt_tokens"] = min(params["min_prompt_tokens"], report.limit_tokens // 2)
    con = connect(":memory:")
    try:
        insert_rows(con, "requests", [p.record(report.model) for p in report.probes])
        prepare(con, {"context_length": report.context_length})
        known_bad = {p.request_id for p in report.over_limit_answered}
        known_bad |= {leak.recipient.request_id for leak in report.leaks}
        for request_id in sorted(known_bad):
            con.execute("INSERT INTO detect_flagged VALUES ($id)", {"id": request_id})
        result = run_detector(con, detector, params).to_pylist()
    finally:
        con.close()
    by_id = {p.request_id: p for p in report.probes}
    return [(by_id[row["request_id"]], row["detail"]) for row in result]


def write_records(path: Path, probes: list[Probe], model: str) -> Path:
    """Write the run as canonical ``requests`` JSON Lines at ``path`` (private, whole).

    Raises:
        ForensicsError: the folder or file cannot be written.
    """
    from forensics.files import private_dirs, write_atomic

    private_dirs(path.parent)
    if path.exists():
        raise ForensicsError(f"{path}: already exists; a canary run never overwrites evidence")
    lines = [json.dumps(p.record(model), sort_keys=True) for p in probes]
    write_atomic(path, ("\n".join(lines) + "\n").encode())
    return path
