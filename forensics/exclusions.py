"""Exclusion rules: mark (never delete) the researcher's and our own test traffic.

A request matches a rule when it matches any of the rule's selectors (tenant ids, API key ids,
client CIDRs, user-agent regex) and, if the rule has ``start``/``end``, falls inside that window.
Excluded recipients leave customer counts; whether their *sources* are notified is decided by
scoping, which still notifies a customer whose data went to an excluded recipient. Rules mark
every loaded request, not only those in the incident window: an excluded request from before
the window can still be the source of a stale page read inside it.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from forensics.terminal import counted_parts, plural

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Exclusion


def describe_rule(ex: Exclusion) -> str:
    """The rule as one readable line for the report.

    >>> from forensics.case import Exclusion
    >>> describe_rule(Exclusion(name="r", tenant_ids=("acct_a",), user_agent_regex="^canary"))
    "tenant_id in ['acct_a'] or user_agent matches regex '^canary'"
    """
    parts = []
    if ex.tenant_ids:
        parts.append(f"tenant_id in {list(ex.tenant_ids)}")
    if ex.api_key_ids:
        parts.append(f"api_key_id in {list(ex.api_key_ids)}")
    if ex.client_cidrs:
        parts.append(f"client_ip in {list(ex.client_cidrs)}")
    if ex.user_agent_regex:
        # Quoted, not between slashes: a pattern ending in "/" would read as "//".
        parts.append(f"user_agent matches regex {ex.user_agent_regex!r}")
    text = " or ".join(parts)
    if ex.start or ex.end:
        start = ex.start.isoformat().replace("+00:00", "Z") if ex.start else "..."
        end = ex.end.isoformat().replace("+00:00", "Z") if ex.end else "..."
        text = f"({text}) and received_at in [{start}, {end})"
    return text


def ips_in_cidrs(ips: list[str], cidrs: tuple[str, ...]) -> list[str]:
    """The addresses (as written) that fall in any of the networks; unparseable ones never do.

    >>> ips = ["10.1.2.3", "192.168.0.1", "junk", "2001:db8::1"]
    >>> ips_in_cidrs(ips, ("10.0.0.0/8", "2001:db8::/32"))
    ['10.1.2.3', '2001:db8::1']
    """
    networks = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    hits = []
    for text in ips:
        try:
            addr = ipaddress.ip_address(text.strip())
        except ValueError:
            continue
        if any(addr.version == n.version and addr in n for n in networks):
            hits.append(text)
    return hits


def mark_exclusions(con: duckdb.DuckDBPyConnection, rules: tuple[Exclusion, ...]) -> None:
    """Fill findings_excluded and findings_exclusions, and set findings_affected.excluded_by."""
    from forensics.schema import FINDINGS_DDL

    con.execute(FINDINGS_DDL["findings_excluded"])
    con.execute(FINDINGS_DDL["findings_exclusions"])
    distinct_ips: list[str] | None = None
    for ordinal, ex in enumerate(rules):
        selectors: list[str] = []
        args: dict[str, Any] = {"name": ex.name}
        if ex.tenant_ids:
            selectors.append("tenant_id IN (SELECT unnest($tenants))")
            args["tenants"] = list(ex.tenant_ids)
        if ex.api_key_ids:
            selectors.append("api_key_id IN (SELECT unnest($keys))")
            args["keys"] = list(ex.api_key_ids)
        if ex.client_cidrs:
            if distinct_ips is None:
                distinct_ips = [
                    r[0]
                    for r in con.execute(
                        "SELECT DISTINCT client_ip FROM requests WHERE client_ip IS NOT NULL"
                    ).fetchall()
                ]
            selectors.append("client_ip IN (SELECT unnest($ips))")
            args["ips"] = ips_in_cidrs(distinct_ips, ex.client_cidrs)
        if ex.user_agent_regex:
            selectors.append("regexp_matches(coalesce(user_agent, ''), $ua)")
            args["ua"] = ex.user_agent_regex
        window = []
        if ex.start:
            window.append("received_at >= $start")
            args["start"] = ex.start
        if ex.end:
            window.append("received_at < $end")
            args["end"] = ex.end
        # Only fixed SQL fragments are joined here; every value is a bound parameter.
        where = "(" + " OR ".join(selectors) + ")"
        if window:
            where += " AND " + " AND ".join(window)
        con.execute(
            "INSERT INTO findings_excluded SELECT request_id, tenant_id, $name "
            f"FROM all_requests WHERE {where}",
            args,
        )
        con.execute(
            """INSERT INTO findings_exclusions
               SELECT $name, $reason, $rule, count(*),
                      count(*) FILTER (WHERE request_id IN (
                          SELECT request_id FROM findings_affected
                          WHERE notified_verdict(verdict))),
                      count(DISTINCT tenant_id), $ordinal
               FROM findings_excluded WHERE exclusion = $name""",
            {"name": ex.name, "reason": ex.reason, "rule": describe_rule(ex), "ordinal": ordinal},
        )
    con.execute(
        """UPDATE findings_affected a SET excluded_by = m.names
           FROM (SELECT e.request_id, string_agg(e.exclusion, ',' ORDER BY x.ordinal) AS names
                 FROM findings_excluded e JOIN findings_exclusions x ON x.name = e.exclusion
                 GROUP BY e.request_id) m
           WHERE a.request_id = m.request_id"""
    )


def overreach_warnings(
    con: duckdb.DuckDBPyConnection, rules: tuple[Exclusion, ...]
) -> list[tuple[str, str]]:
    """A warning for each rule that takes, from tenants its tenant_ids do not name (by API key,
    address, user agent or time), affected responses or requests whose KV another tenant's
    response read: those leave the customer counts and are not notified, so a rule wider than the
    researcher's and our own traffic would hide customers. Run after attribution.

    The tenants are named, up to five: the warning goes to the report and the terminal, never
    to a customer.
    """
    warnings = []
    for ex in rules:
        # Joins, not membership tests in the select list, which Spark plans as nested loops.
        hits = """WITH beyond AS (
                 SELECT request_id, tenant_id FROM findings_excluded
                 WHERE exclusion = $name AND tenant_id IS NOT NULL
                   AND tenant_id NOT IN (SELECT unnest($tenants))
               ),
               hit AS (
                 SELECT b.tenant_id, 1 AS affected, 0 AS read
                 FROM beyond b JOIN findings_affected a ON a.request_id = b.request_id
                 WHERE notified_verdict(a.verdict)
                 UNION ALL
                 SELECT b.tenant_id, 0 AS affected, 1 AS read
                 FROM beyond b
                 JOIN (SELECT DISTINCT source_request_id FROM findings_exposures
                       WHERE recipient_tenant_id IS DISTINCT FROM source_tenant_id) x
                   ON x.source_request_id = b.request_id
               )"""
        args = {"name": ex.name, "tenants": list(ex.tenant_ids) or [""]}
        found = con.execute(
            f"{hits} SELECT count(DISTINCT tenant_id), sum(affected), sum(read) FROM hit", args
        ).fetchone()
        tenants, affected, read = (int(v or 0) for v in (found or (0, 0, 0)))
        named = [
            r[0]
            for r in con.execute(
                f"{hits} SELECT DISTINCT tenant_id FROM hit ORDER BY tenant_id LIMIT 5", args
            ).fetchall()
        ]
        if not tenants:
            continue
        some = ", ".join(named) + (", ..." if tenants > len(named) else "")
        taken = counted_parts(
            (affected, f"{plural(affected, 'affected response')}"),
            (read, f"{plural(read, 'request')} whose KV another tenant read"),
        )
        warnings.append(
            (
                "exclusion_beyond_named_tenants",
                f"exclusion {ex.name} takes {taken} from {plural(tenants, 'tenant')}"
                f" its tenant_ids do not name ({some}): they leave the customer counts and are"
                " not notified. Check that its other selectors match only the researcher's and"
                " our own traffic.",
            )
        )
    return warnings
