"""A simulated case in the formats a real serving stack writes, instead of canonical files.

The canonical evidence the simulator wrote is rewritten, field for field, as:

- ``sglang``: each engine's stdout, ``evidence/sglang/<node>.log.gz`` (prefill nodes in the
  text form of ``--log-requests`` with the scheduler's rejection lines, decode nodes in its
  JSON form with the KV-capacity lines and each allocation's time-stats line: a decode
  request is received with its prefill and allocated after the bootstrap handshake and any
  wait for free pages), the tenant as a ``tenant_id`` custom label; saved
  ``/get_server_info`` documents at every change of a pool, ``evidence/server_info/``; and no
  client log at all (the engine-only case).
- ``otel``: the same engine logs, and the client requests as GenAI spans in the collector's
  OTLP/JSON file-exporter form, ``evidence/otel/traces-<day>.jsonl.gz``.
- ``litellm``: the same engine logs, and the client requests as a ``LiteLLM_SpendLogs`` CSV
  export per day, ``evidence/litellm/spend_logs-<day>.csv.gz``.

Tenant profiles stay canonical (no serving stack writes them). Values carry the precision the
canonical files had: engine times as ``received_time`` epoch seconds with six decimals and the
end as ``received_time + e2e_latency``; span times in nanoseconds.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

FORMATS = ("sglang", "otel", "litellm")
MODEL_PATH = "zai-org/GLM-5.3"


def _gzip(path: Path, text: str) -> Path:
    # No name and mtime 0 in the header: the same case gives the same bytes.
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
        gz.write(text.encode("utf-8"))
    path.write_bytes(buf.getvalue())
    return path


def _seconds(us: int) -> str:
    """Microseconds as decimal seconds with six digits, exactly (no float on the way)."""
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def _wall(us: int) -> str:
    """The logging prefix's wall clock (UTC, the simulated case's zone), to the second."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(us // 1_000_000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _iso(us: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(us // 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{us % 1_000_000:06d}"
    )


def _us(df: pl.DataFrame, col: str) -> pl.Expr:
    import polars as pl

    if df.schema[col] == pl.String:
        return (
            pl.col(col).str.to_datetime(time_zone="UTC", time_unit="us").dt.epoch("us").alias(col)
        )
    return pl.col(col).dt.epoch("us").alias(col)


def _read(out: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    import polars as pl

    reqs = pl.concat(
        [
            pl.read_ndjson(gzip.decompress(p.read_bytes()))
            for p in sorted((out / "evidence").glob("requests-*.jsonl.gz"))
        ],
        how="vertical_relaxed",
    )
    reqs = reqs.with_columns(
        [_us(reqs, c) for c in ("received_at", "first_token_at", "completed_at")]
    )
    legs = pl.concat(
        [pl.read_parquet(p) for p in sorted((out / "evidence").glob("engine_legs-*.parquet"))]
    )
    legs = legs.with_columns([_us(legs, c) for c in ("started_at", "finished_at")])
    pools = pl.read_csv(out / "evidence" / "pool_snapshots.csv", infer_schema_length=0)
    return reqs, legs, pools


def rewrite(
    out: Path, fmt: str, evidence: list, bootstrap: dict[str, int] | None = None
) -> tuple[list[Path], list]:
    """Replace the canonical evidence under ``out`` with ``fmt``'s; return the files written
    and the manifest's [[evidence]] entries (kind, format, paths, more keys).

    ``bootstrap`` is each request's decode bootstrap handshake in microseconds (no canonical
    file holds it): the part of its preallocation queueing that was not waiting for pages.
    """
    reqs, legs, pools = _read(out)
    tenant = dict(zip(reqs["request_id"], reqs["tenant_id"], strict=True))
    completion = dict(zip(reqs["request_id"], reqs["completion_tokens"], strict=True))
    received = dict(zip(reqs["request_id"], reqs["received_at"], strict=True))
    snapshots = _server_info(out, pools)
    timing = _decode_timing(legs, received, bootstrap or {})
    files = _engine_logs(out, legs, tenant, completion, timing) + [p for p, _, _ in snapshots]
    entries = [
        ("engine_legs", "sglang", ["evidence/sglang/prefill-*.log.gz"], {"role": "prefill"}),
        ("engine_legs", "sglang", ["evidence/sglang/decode-*.log.gz"], {"role": "decode"}),
    ]
    for path, node, observed in snapshots:
        where = [f"evidence/server_info/{path.name}"]
        entries.append(("pool_snapshots", "sglang", where, {"node": node, "observed_at": observed}))
    if fmt == "otel":
        files += _spans(out, reqs)
        entries.append(("requests", "otel", ["evidence/otel/traces-*.jsonl.gz"], {}))
    elif fmt == "litellm":
        files += _spend_logs(out, reqs)
        entries.append(("requests", "litellm", ["evidence/litellm/spend_logs-*.csv.gz"], {}))
    replaced = {"requests", "engine_legs", "pool_snapshots"}
    kept = [e for e in evidence if e[0] not in replaced]
    for pattern in ("requests-*.jsonl.gz", "engine_legs-*.parquet", "pool_snapshots.csv"):
        for p in (out / "evidence").glob(pattern):
            p.unlink()
    return files, entries + kept


# --- engine logs ------------------------------------------------------------------------------


def _finish(row: dict) -> dict:
    reason: dict = {"type": row["finish_type"]}
    if row["finish_type"] == "abort":
        reason |= {"message": row["error"], "status_code": row["status_code"]}
    elif row["finish_type"] == "length":
        reason["length"] = 0
    return reason


def _prefill_lines(row: dict, tenant: str | None) -> list[tuple[int, int, str]]:
    start, end = row["started_at"], row["finished_at"]
    label = f", custom_labels={{'tenant_id': {tenant!r}}}" if tenant else ""
    obj = (
        f"GenerateReqInput(rid={row['request_id']!r}, received_time={_seconds(start)}, "
        f"bootstrap_host='10.0.0.5', bootstrap_port=8998, "
        f"bootstrap_room={row['bootstrap_room']}{label})"
    )
    lines = [(start, 0, f"[{_wall(start)}] Receive: obj={obj}")]
    if row["error"]:
        lines.append(
            (start, 1, f"[{_wall(start)} TP0] {row['error']}, self.rid={row['request_id']!r}")
        )
    if end is not None:
        meta = {
            "id": row["request_id"],
            "finish_reason": _finish(row),
            "prompt_tokens": row["input_tokens"],
            "completion_tokens": 1,
            "cached_tokens": 0,
            "e2e_latency": _seconds(end - start),
        }
        # The text form is a Python repr: floats unquoted, strings in single quotes.
        out = repr({"text": "", "meta_info": meta}).replace(
            repr(meta["e2e_latency"]), meta["e2e_latency"]
        )
        lines.append((end, 2, f"[{_wall(end)}] Finish: obj={obj}, out={out}"))
    return lines


@dataclass(frozen=True)
class DecodeTiming:
    """When a decode leg's engine saw its request, beyond the canonical allocation instant."""

    received: int  # the decode server received the request (the router sends it to both)
    entry: int  # it entered the preallocation queue (tokenized and dispatched, as prefill)
    bootstrap: int  # of the queueing, the handshake with prefill; the rest waited for pages
    transferred: int  # prefill released its KV: the transfer into the allocated pages is done


def _decode_timing(legs: pl.DataFrame, received: dict, bootstrap: dict) -> dict[str, DecodeTiming]:
    import polars as pl

    prefill = legs.filter(pl.col("role") == "prefill")
    return {
        rid: DecodeTiming(received.get(rid, start), start, bootstrap.get(rid, 0), end)
        for rid, start, end in prefill.select("request_id", "started_at", "finished_at").iter_rows()
    }


# The engines' start: their monotonic clock counts from it (a perf counter, not a wall clock).
_ENGINE_BOOT_US = 1_785_542_400_000_000  # 2026-08-01 00:00 UTC


def _ms(us: int) -> str:
    """A duration as SGLang's time-stats line prints it: milliseconds, two decimals."""
    return f"{us / 1000:.2f}ms"


def _round10(us: int) -> int:
    # The line's precision: 10 microseconds.
    return (us + 5) // 10 * 10


def _time_stats(row: dict, output: int, t: DecodeTiming) -> str:
    """The decode leg's ``--enable-request-time-stats-logging`` line: its queueing split into
    the bootstrap handshake and the wait for free pages, then transfer, queue and forward up
    to its end. ``start`` is the scheduler's monotonic clock, not a wall clock."""
    start, end = row["started_at"], row["finished_at"]
    prealloc = _round10(start - t.entry)
    boot = min(_round10(t.bootstrap), prealloc)
    held = _round10(end - start)
    transfer = min(_round10(max(t.transferred - start, 0)), held)
    monotonic = (t.entry - _ENGINE_BOOT_US) / 1e6
    return (
        f"ReqTimeStats(rid={row['request_id']}, bootstrap_room={row['bootstrap_room']}, "
        f"input_len={row['input_tokens']}, cached_input_len=0, output_len={output}, "
        f"type=decode): prealloc_queue_duration({_ms(prealloc)}) = bootstrap({_ms(boot)}) + "
        f"alloc_wait({_ms(prealloc - boot)}); transfer_duration={_ms(transfer)}; "
        f"queue_duration={_ms(0)}, forward_duration={_ms(held - transfer)}, "
        f"start={monotonic:.3f}"
    )


def _decode_lines(
    row: dict, tenant: str | None, completion, timing: DecodeTiming | None
) -> list[tuple[int, int, str]]:
    start, end = row["started_at"], row["finished_at"]
    # The decode server gets the request when prefill does and logs that as its received
    # time; its pages are allocated later, after the handshake and any wait for free pages.
    recv = timing.received if timing else start
    obj = {
        "rid": row["request_id"],
        "received_time": "@recv@",
        "bootstrap_room": int(row["bootstrap_room"]),
        "data_parallel_rank": row["dp_rank"],
        "stream": True,
    }
    if tenant:
        obj["custom_labels"] = {"tenant_id": tenant}

    def event(at: int, name: str, **more) -> str:
        text = json.dumps(
            {"timestamp": _iso(at), "event": name, "rid": row["request_id"], "obj": obj, **more}
        )
        # Exact decimal seconds, written as JSON numbers.
        return text.replace('"@recv@"', _seconds(recv)).replace('"@e2e@"', _seconds(end - recv))

    lines = [(recv, 0, event(recv, "request.received"))]
    if row["error"]:
        lines.append((start, 1, f"[{_wall(start)} TP0] {row['error']}"))
    elif timing:
        prefix = f"[{_wall(end)} DP{row['dp_rank']} TP0] "
        lines.append((end, 1, prefix + _time_stats(row, completion or 0, timing)))
    meta = {
        "id": row["request_id"],
        "finish_reason": _finish(row),
        "prompt_tokens": row["input_tokens"],
        "completion_tokens": completion or 0,
        "cached_tokens": 0,
        "e2e_latency": "@e2e@",
        "dp_rank": row["dp_rank"],
    }
    lines.append((end, 2, event(end, "request.finished", out={"meta_info": meta})))
    return lines


def _engine_logs(
    out: Path, legs: pl.DataFrame, tenant: dict, completion: dict, timing: dict
) -> list[Path]:
    folder = out / "evidence" / "sglang"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for (node,), part in sorted(legs.partition_by("node", as_dict=True).items()):
        lines: list[tuple[int, int, str]] = []
        for row in part.iter_rows(named=True):
            who = tenant.get(row["request_id"])
            if row["role"] == "prefill":
                lines += _prefill_lines(row, who)
            else:
                rid = row["request_id"]
                lines += _decode_lines(row, who, completion.get(rid), timing.get(rid))
        lines.sort()
        text = "".join(line + "\n" for _, _, line in lines)
        files.append(_gzip(folder / f"{node}.log.gz", text))
    return files


def _server_info(out: Path, pools: pl.DataFrame) -> list[tuple[Path, str, str]]:
    """One saved ``/get_server_info`` per node and change of its pool (what a responder who
    saved them at each restart holds), with the node and time its manifest entry gives."""
    import polars as pl

    folder = out / "evidence" / "server_info"
    folder.mkdir(parents=True, exist_ok=True)
    values = [c for c in pools.columns if c not in ("node", "observed_at")]
    pools = pools.sort(["node", "observed_at"]).with_columns(
        pl.concat_str(values, separator="|", ignore_nulls=False).alias("_v")
    )
    changed = pools.filter(pl.col("_v") != pl.col("_v").shift(1).over("node").fill_null(""))
    files = []
    for i, row in enumerate(changed.iter_rows(named=True)):
        doc = {
            "model_path": MODEL_PATH,
            "disaggregation_mode": row["role"],
            "disaggregation_transfer_backend": "mooncake",
            "context_length": int(row["context_length"]),
            "page_size": int(row["page_size"]),
            "dp_size": int(row["dp_size"]),
            "tp_size": 8,
            # Each engine's own address: two engines' documents are never the same file.
            "dist_init_addr": f"{row['node']}.pd.internal:5000",
            "status": "ready",
            "max_total_num_tokens": int(row["max_total_num_tokens"]),
            "max_req_input_len": int(row["max_req_input_len"]),
            "version": row["engine_version"],
        }
        # Saved by hand, some pretty-printed and some not.
        text = json.dumps(doc, indent=2 if i % 2 == 0 else None) + "\n"
        stamp = "".join(c for c in row["observed_at"][:19] if c.isdigit() or c == "T")
        path = folder / f"{row['node']}-{stamp}Z.json"
        path.write_text(text, encoding="utf-8")
        files.append((path, row["node"], row["observed_at"]))
    return files


# --- client requests -------------------------------------------------------------------------


def _days(reqs: pl.DataFrame):
    import polars as pl

    day = pl.from_epoch(pl.col("received_at"), time_unit="us").dt.strftime("%Y-%m-%d")
    parts = reqs.sort(["received_at", "request_id"]).with_columns(day.alias("_day"))
    return sorted(parts.partition_by("_day", as_dict=True, maintain_order=True).items())


def _attr(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    if isinstance(value, list):
        return {
            "key": key,
            "value": {"arrayValue": {"values": [{"stringValue": v} for v in value]}},
        }
    return {"key": key, "value": {"stringValue": value}}


def _span(row: dict) -> dict:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": row["model"],
        "gen_ai.response.id": row["request_id"],
        "tenant.id": row["tenant_id"],
        "gen_ai.usage.input_tokens": row["prompt_tokens"],
        "gen_ai.usage.output_tokens": row["completion_tokens"],
        "gen_ai.usage.cache_read.input_tokens": row["cached_tokens"],
        "http.response.status_code": row["http_status"],
        "prefill_node": row["prefill_node"],
        "decode_node": row["decode_node"],
        "dp_rank": row["dp_rank"],
        "bootstrap_room": row["bootstrap_room"],
        "api_key_id": row["api_key_id"],
        "client.address": row["client_ip"],
        "user_agent.original": row["user_agent"],
    }
    if row["finish_reason"]:
        attrs["gen_ai.response.finish_reasons"] = [row["finish_reason"]]
    if row["first_token_at"] is not None:
        attrs["gen_ai.response.time_to_first_chunk"] = (
            row["first_token_at"] - row["received_at"]
        ) / 1e6
    if row["http_status"] >= 400:
        attrs["error.type"] = str(row["http_status"])
    span = {
        "traceId": hashlib.md5(row["request_id"].encode()).hexdigest(),
        "spanId": row["request_id"][-16:].rjust(16, "0"),
        "name": f"chat {row['model']}",
        "kind": "SPAN_KIND_CLIENT",
        "startTimeUnixNano": str(row["received_at"] * 1000),
        "endTimeUnixNano": str(row["completed_at"] * 1000),
        "attributes": [_attr(k, v) for k, v in attrs.items() if v is not None],
    }
    if row["http_status"] >= 400:
        span["status"] = {"code": "STATUS_CODE_ERROR"}
    return span


def _spans(out: Path, reqs: pl.DataFrame) -> list[Path]:
    folder = out / "evidence" / "otel"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    resource = {"attributes": [_attr("service.name", "gateway")]}
    for (day,), part in _days(reqs):
        rows = list(part.iter_rows(named=True))
        lines = []
        # The file exporter writes one export per batch of spans.
        for i in range(0, len(rows), 200):
            spans = [_span(r) for r in rows[i : i + 200]]
            export = {
                "resourceSpans": [
                    {
                        "resource": resource,
                        "scopeSpans": [{"scope": {"name": "gw"}, "spans": spans}],
                    }
                ]
            }
            lines.append(json.dumps(export, separators=(",", ":")))
        files.append(_gzip(folder / f"traces-{day}.jsonl.gz", "\n".join(lines) + "\n"))
    return files


def _spend_logs(out: Path, reqs: pl.DataFrame) -> list[Path]:
    import csv

    folder = out / "evidence" / "litellm"
    folder.mkdir(parents=True, exist_ok=True)
    header = [
        "request_id",
        "call_type",
        "api_key",
        "spend",
        "total_tokens",
        "prompt_tokens",
        "completion_tokens",
        "startTime",
        "endTime",
        "completionStartTime",
        "model",
        "model_group",
        "team_id",
        "status",
        "requester_ip_address",
        "metadata",
        "response",
    ]
    files = []
    for (day,), part in _days(reqs):
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        for r in part.iter_rows(named=True):
            ok = 200 <= r["http_status"] < 300
            spend_meta = {
                k: r[k]
                for k in ("prefill_node", "decode_node", "dp_rank", "bootstrap_room", "user_agent")
                if r[k] is not None
            }
            meta: dict = {"user_api_key_team_id": r["tenant_id"], "spend_logs_metadata": spend_meta}
            if r["cached_tokens"] is not None:
                meta["additional_usage_values"] = {
                    "prompt_tokens_details": {"cached_tokens": r["cached_tokens"]}
                }
            if not ok:
                meta["error_information"] = {"error_code": str(r["http_status"])}
            response = (
                {
                    "id": r["request_id"],
                    "choices": [{"index": 0, "finish_reason": r["finish_reason"]}],
                }
                if r["finish_reason"]
                else None
            )
            first = r["first_token_at"]
            writer.writerow(
                [
                    r["request_id"],
                    "acompletion",
                    r["api_key_id"],
                    0,
                    (r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0),
                    r["prompt_tokens"],
                    r["completion_tokens"] if r["completion_tokens"] is not None else "",
                    _iso(r["received_at"]).replace("T", " "),
                    _iso(r["completed_at"]).replace("T", " "),
                    "" if first is None else _iso(first).replace("T", " "),
                    f"hosted_vllm/{r['model']}",
                    r["model"],
                    r["tenant_id"],
                    "success" if ok else "failure",
                    r["client_ip"],
                    json.dumps(meta),
                    json.dumps(response) if response else "",
                ]
            )
        files.append(_gzip(folder / f"spend_logs-{day}.csv.gz", buf.getvalue()))
    return files
