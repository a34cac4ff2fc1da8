"""The SQL detectors of ``queries/``: each a ``.sql`` file and a ``.yml`` of metadata beside it.

The metadata is validated against a declared schema when it is loaded: a missing key, a
misspelt one, a value of the wrong kind or a description naming an undeclared parameter stops
detection with one line naming the file and the key. Each detector declares there how its
signal weighs in the verdict (``verdict``), so adding a detector is adding two files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError
from forensics.paths import queries_dir
from forensics.verdicts import VERDICTS

SIGNAL_COLUMNS = ["request_id", "value", "threshold", "detail", "evidence"]
SEVERITIES = ("critical", "high", "medium", "low")

# key -> (kinds accepted, required). Unknown keys are refused: a misspelt key must not be
# silently ignored.
_TOP = {
    "id": (str, True),
    "title": (str, True),
    "severity": (str, True),
    "signal": (str, True),
    "description": (str, True),
    "verdict": (dict, True),
    "output_columns": (list, True),
    "tests": (list, True),
    "parameters": (dict, False),
    "stage": (int, False),
    "limit_from_threshold": (int, False),
}
# above/below: the open interval a value set in the manifest must lie in (default: above 0).
_PARAMETER = {
    "default": (object, True),
    "description": (str, True),
    "above": ((int, float), False),
    "below": ((int, float), False),
}
_TEST = {
    "name": (str, True),
    "expect": (list, True),
    "rows": (dict, False),
    "params": (dict, False),
}
# How a signal weighs in its request's verdict. The first rule that applies decides, in this
# order; the request takes the strongest verdict of its signals.
#   with_other_signal: another detector flagged the same request too
#   if_prefill_complete: the request's own prefill leg processed the whole prompt with no
#                        rejection (the limit on record was not the one the node applied)
#   if_long_prompt: the prompt is at least [detection].long_prompt_tokens long
#   base: otherwise
VERDICT_RULES = ("with_other_signal", "if_prefill_complete", "if_long_prompt", "base")
_VERDICT = {rule: (str, rule == "base") for rule in VERDICT_RULES}


@dataclass(frozen=True)
class Detector:
    """One SQL detector and its validated metadata."""

    id: str
    title: str
    severity: str
    signal: str
    description: str
    parameters: dict[str, dict[str, Any]]
    output_columns: list[str]
    tests: list[dict[str, Any]]
    verdict: dict[str, str]
    sql: str
    path: Path
    stage: int = 1
    # This signal's threshold is the input limit in tokens (the affected response's
    # threshold_tokens); when several signals carry one, the lowest rank names it.
    limit_from_threshold: int | None = None

    def defaults(self) -> dict[str, Any]:
        return {name: spec["default"] for name, spec in self.parameters.items()}

    def describe(self, params: dict[str, Any]) -> str:
        """The description with this run's parameter values filled in.

        >>> d = load_detectors()[0]
        >>> "{" in d.describe(d.defaults())
        False
        """
        shown = {k: _show(params.get(k, spec["default"])) for k, spec in self.parameters.items()}
        return " ".join(self.description.format(**shown).split())


def _show(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def check_mapping(where: str, value: Any, schema: dict[str, tuple[Any, bool]]) -> dict:
    """Check one mapping against its schema: no unknown key, every required key, each of its
    kind. Raises ForensicsError naming ``where`` and the key.

    >>> check_mapping("x.yml", {"name": "a", "expect": []}, _TEST)
    {'name': 'a', 'expect': []}
    >>> check_mapping("x.yml", {"name": "a", "expects": []}, _TEST)
    Traceback (most recent call last):
    ...
    forensics.errors.ForensicsError: x.yml: unknown key 'expects' (expected one of: ...)
    """
    if not isinstance(value, dict):
        raise ForensicsError(f"{where}: must be a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - set(schema))
    if unknown:
        raise ForensicsError(
            f"{where}: unknown key {unknown[0]!r} (expected one of: {', '.join(sorted(schema))})"
        )
    for key, (kind, required) in schema.items():
        if key not in value:
            if required:
                raise ForensicsError(f"{where}: missing key {key!r}")
            continue
        item = value[key]
        wrong = not isinstance(item, kind) or (kind is int and isinstance(item, bool))
        if wrong:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            name = " or ".join(k.__name__ for k in kinds)
            raise ForensicsError(f"{where}: {key!r} must be a {name}, got {item!r}")
    return value


def parse_metadata(meta: Any, where: str) -> dict[str, Any]:
    """Validate one detector's metadata (the parsed YAML); returns it with defaults filled."""
    check_mapping(where, meta, _TOP)
    if meta["severity"] not in SEVERITIES:
        raise ForensicsError(
            f"{where}: severity must be one of {', '.join(SEVERITIES)}, got {meta['severity']!r}"
        )
    if meta["output_columns"] != SIGNAL_COLUMNS:
        raise ForensicsError(f"{where}: output_columns must be {SIGNAL_COLUMNS}")
    parameters = meta.get("parameters") or {}
    for name, spec in parameters.items():
        check_mapping(f"{where}: parameters.{name}", spec, _PARAMETER)
    check_mapping(f"{where}: verdict", meta["verdict"], _VERDICT)
    for rule, verdict in meta["verdict"].items():
        if verdict not in VERDICTS:
            raise ForensicsError(
                f"{where}: verdict.{rule} must be one of {', '.join(VERDICTS)}, got {verdict!r}"
            )
    for i, test in enumerate(meta["tests"]):
        check_mapping(f"{where}: tests[{i}]", test, _TEST)
    try:
        meta["description"].format(**{k: "" for k in parameters})
    except (KeyError, IndexError, ValueError) as exc:
        raise ForensicsError(
            f"{where}: description names {exc} that is not a declared parameter"
        ) from None
    return meta | {"parameters": parameters, "stage": meta.get("stage", 1)}


def load_detectors(folder: Path | None = None) -> list[Detector]:
    """Every detector in ``queries/``, validated, in run order (stage, then id)."""
    import yaml

    folder = folder or queries_dir()
    detectors = []
    for sql_path in sorted(folder.glob("*.sql")):
        meta_path = sql_path.with_suffix(".yml")
        if not meta_path.exists():
            raise ForensicsError(f"{sql_path.name}: detector has no metadata file {meta_path.name}")
        try:
            raw = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            first = str(exc).strip().splitlines()[0]
            raise ForensicsError(f"{meta_path.name}: not valid YAML ({first})") from None
        meta = parse_metadata(raw, meta_path.name)
        if meta["id"] != sql_path.stem:
            raise ForensicsError(f"{meta_path.name}: id {meta['id']!r} is not the file name")
        detectors.append(
            Detector(
                id=meta["id"],
                title=meta["title"],
                severity=meta["severity"],
                signal=meta["signal"],
                description=meta["description"],
                parameters=meta["parameters"],
                output_columns=meta["output_columns"],
                tests=meta["tests"],
                verdict=meta["verdict"],
                sql=sql_path.read_text(encoding="utf-8"),
                path=sql_path,
                stage=meta["stage"],
                limit_from_threshold=meta.get("limit_from_threshold"),
            )
        )
    return sorted(detectors, key=lambda d: (d.stage, d.id))


def query_set_hash(folder: Path | None = None) -> str:
    """sha256 over every detector file (name and bytes), so a report names the exact rules."""
    folder = folder or queries_dir()
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.sql")) + sorted(folder.glob("*.yml")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
