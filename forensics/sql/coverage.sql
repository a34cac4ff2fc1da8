-- Log coverage: what each side's evidence spans, where it has holes, and which requests one
-- side saw and the other did not. Conclusions are only as good as this table.
--
-- A quiet hour is not a hole (traffic is diurnal, nodes idle). A hole is a silence longer than
-- $gap_s in one record while the other record shows work there: client requests routed to a
-- node whose engine log says nothing, or engine work while the client log says nothing (a
-- minute's slack each side: an engine leg starts a little after its client request).
--
-- Nothing here copies a row per request or leg: at a hundred million requests such a copy
-- outgrows memory and fills the disk with spill. Each series is read and grouped as it streams.
CREATE OR REPLACE TEMP VIEW coverage_series AS
SELECT 'requests' AS scope, NULL::VARCHAR AS node, received_at AS "at" FROM scoped_requests
UNION ALL
SELECT 'engine_legs:' || l.role, l.node, l.started_at
FROM engine_legs l, detect_params p
WHERE (p.start_at IS NULL OR l.started_at >= p.start_at)
  AND (p.end_at IS NULL OR l.started_at <= p.end_at);

-- Each series' rows by bucket of whole milliseconds no wider than $gap_s (rows with no time in
-- a bucket of their own): rows in one bucket are closer than $gap_s, so a longer silence runs
-- from the last row of one occupied bucket to the first of the next, and ordering the occupied
-- buckets, not every row, finds each one. The per-series counts and spans add up from here.
CREATE OR REPLACE TEMP TABLE coverage_buckets AS
SELECT scope, node, count(*) AS n, min("at") AS first_at, max("at") AS last_at
FROM coverage_series
GROUP BY scope, node, floor(epoch_ms("at") / greatest(floor($gap_s * 1000), 1));

-- Silences long enough to matter, with the span inside them where the other side's work
-- would show (a minute's slack at each end).
CREATE OR REPLACE TEMP TABLE coverage_candidates AS
SELECT scope, node, from_at, to_at,
       date_diff('millisecond', from_at, to_at) / 1000.0 AS gap_s,
       from_at + INTERVAL 1 MINUTE AS lo, to_at - INTERVAL 1 MINUTE AS hi
FROM (
  SELECT scope, node, lag(last_at) OVER (PARTITION BY scope, node ORDER BY first_at) AS from_at,
         first_at AS to_at
  FROM coverage_buckets
  WHERE first_at IS NOT NULL
)
WHERE date_diff('millisecond', from_at, to_at) / 1000.0 > $gap_s;

-- A silence is a hole when the first piece of the other side's work after its start falls
-- before its end: one as-of join per side, whatever the number of silences.
CREATE OR REPLACE TEMP TABLE coverage_holes AS
SELECT c.scope, c.node, c.from_at, c.to_at, c.gap_s
FROM (SELECT * FROM coverage_candidates WHERE scope = 'requests') c
ASOF JOIN (SELECT started_at AS "at" FROM engine_legs WHERE started_at IS NOT NULL) w
  ON c.lo < w."at"
WHERE w."at" < c.hi
UNION ALL
SELECT c.scope, c.node, c.from_at, c.to_at, c.gap_s
FROM (SELECT * FROM coverage_candidates WHERE scope <> 'requests') c
ASOF JOIN (
  -- The other side's work, per node: client requests routed to it (prefill or decode).
  SELECT prefill_node AS node, received_at AS "at" FROM scoped_requests
  WHERE prefill_node IS NOT NULL AND received_at IS NOT NULL
  UNION ALL
  SELECT decode_node, received_at FROM scoped_requests
  WHERE decode_node IS NOT NULL AND received_at IS NOT NULL
    AND decode_node IS DISTINCT FROM prefill_node
) w ON c.node = w.node AND c.lo < w."at"
WHERE w."at" < c.hi;

INSERT INTO findings_coverage
SELECT c.scope, c.node, sum(c.n)::BIGINT, min(c.first_at), max(c.last_at),
       coalesce(any_value(h.holes), 0), coalesce(any_value(h.largest), 0),
       CASE WHEN coalesce(any_value(h.holes), 0) = 0
            THEN format('{} rows; no silence over {} s while the other side shows work',
                        sum(c.n)::BIGINT, $gap_s)
            ELSE format('{} rows; {} silences over {} s while the other side shows work,'
                        || ' longest from {} to {}', sum(c.n)::BIGINT, any_value(h.holes), $gap_s,
                        strftime(any_value(h.longest_from), '%Y-%m-%dT%H:%M:%SZ'),
                        strftime(any_value(h.longest_to), '%Y-%m-%dT%H:%M:%SZ'))
       END
FROM coverage_buckets c
LEFT JOIN (SELECT scope, node, count(*) AS holes, max(gap_s) AS largest,
                  arg_max(from_at, gap_s) AS longest_from, arg_max(to_at, gap_s) AS longest_to
           FROM coverage_holes GROUP BY scope, node) h
  ON h.scope = c.scope AND h.node IS NOT DISTINCT FROM c.node
GROUP BY c.scope, c.node;

-- Successful requests in scope that lack an engine leg: any at all (client_only), or the
-- prefill or decode leg of the node their client record names (leg_missing). Each side is an
-- anti join of the requests against the legs (a hash join in DuckDB and in Spark), and only
-- the requests that lack one are kept: grouping the legs by request id instead (100M groups of
-- strings at 100M requests) ran out of memory under the 2 GB cap. One statement per side, so
-- that one hash table of the legs is built at a time: both sides in one statement spilled
-- more (this file took 7.7-7.9 s against 5.0 s at 16M requests under a 2 GB cap, 4.2 s
-- against 2.8 s at 8M under 1 GB, the same rows). Request ids are unique, so the joins below
-- add no rows. A leg of another role (neither prefill, decode nor unified) still shows the
-- request was logged. With no engine log loaded at all, nothing is missing from it: coverage
-- says so on its own.
CREATE OR REPLACE TEMP MACRO requests_lacking(side) AS TABLE
SELECT r.request_id
FROM scoped_requests r
WHERE r.http_status BETWEEN 200 AND 299
  AND EXISTS (SELECT 1 FROM engine_legs)
  AND NOT EXISTS (SELECT 1 FROM client_legs l
                  WHERE l.client_request_id = r.request_id
                    AND l.role IN (side, 'unified'));

CREATE OR REPLACE TEMP TABLE coverage_no_prefill AS FROM requests_lacking('prefill');
CREATE OR REPLACE TEMP TABLE coverage_no_decode AS FROM requests_lacking('decode');

CREATE OR REPLACE TEMP TABLE coverage_unlogged AS
WITH lacking AS (
  SELECT r.request_id, r.received_at, r.prefill_node, r.decode_node,
         p.request_id IS NULL AS prefill, d.request_id IS NULL AS decode
  FROM scoped_requests r
  LEFT JOIN coverage_no_prefill p ON p.request_id = r.request_id
  LEFT JOIN coverage_no_decode d ON d.request_id = r.request_id
  WHERE p.request_id IS NOT NULL OR d.request_id IS NOT NULL
),
other_role AS (
  SELECT k.request_id FROM lacking k
  WHERE EXISTS (SELECT 1 FROM client_legs l
                WHERE l.client_request_id = k.request_id
                  AND l.role NOT IN ('prefill', 'decode', 'unified'))
)
SELECT k.request_id, k.received_at, k.prefill_node, k.decode_node,
       k.prefill OR k.decode OR x.request_id IS NOT NULL AS logged, k.prefill, k.decode
FROM lacking k
LEFT JOIN other_role x ON x.request_id = k.request_id;

INSERT INTO findings_coverage
SELECT 'client_only', prefill_node, count(*), min(received_at), max(received_at), 0, 0,
       format('{} successful requests with no engine leg (engine logs missing for them)',
              count(*))
FROM coverage_unlogged
WHERE NOT logged
GROUP BY prefill_node;

-- Requests with engine legs, but not on a node the client log says they were routed to: that
-- node's log is missing for them (a whole node's log left out shows here, as no silence can).
CREATE OR REPLACE TEMP TABLE coverage_missing_legs AS
SELECT request_id, 'prefill' AS role, prefill_node AS node, received_at FROM coverage_unlogged
WHERE logged AND prefill_node IS NOT NULL AND NOT prefill
UNION ALL
SELECT request_id, 'decode', decode_node, received_at FROM coverage_unlogged
WHERE logged AND decode_node IS NOT NULL AND NOT decode;

-- Without a client record nothing says where an engine request was routed, but in PD a
-- prefill that completed hands the request to a decode node, which logs a leg of its own. A
-- prefill leg that completed without an error, with no decode leg anywhere, lost it to a
-- decode log that is missing (which node, the logs do not say).
INSERT INTO coverage_missing_legs
SELECT e.request_id, 'decode', NULL, e.received_at
FROM engine_requests e, detect_params p
WHERE e.prefill_node IS NOT NULL AND e.decode_node IS NULL
  AND e.engine_key NOT IN (SELECT engine_key FROM orphan_legs
                           WHERE role = 'prefill' AND error IS NOT NULL)
  AND (p.start_at IS NULL OR e.received_at >= p.start_at)
  AND (p.end_at IS NULL OR e.received_at <= p.end_at);

-- The other way round: a decode leg is the second half of a PD request, whose first half a
-- prefill node logs (a rejection too). A decode leg with no prefill leg anywhere lost it to a
-- prefill log that is missing, and with it the node whose limit the prompt met.
INSERT INTO coverage_missing_legs
SELECT e.request_id, 'prefill', NULL, e.received_at
FROM engine_requests e, detect_params p
WHERE e.prefill_node IS NULL
  AND e.engine_key IN (SELECT engine_key FROM orphan_legs WHERE role = 'decode')
  AND (p.start_at IS NULL OR e.received_at >= p.start_at)
  AND (p.end_at IS NULL OR e.received_at <= p.end_at);

INSERT INTO findings_coverage
SELECT 'leg_missing:' || role, node, count(*), min(received_at), max(received_at), 0, 0,
       CASE WHEN node IS NULL AND role = 'prefill'
            THEN format('{} engine requests with a decode leg but no prefill leg anywhere (a'
                        || ' prefill log is missing for them; which node, the logs do not say)',
                        count(*))
            WHEN node IS NULL
            THEN format('{} engine requests whose prefill completed with no {} leg anywhere (a'
                        || ' {} log is missing for them; which node, the logs do not say)',
                        count(*), role, role)
            ELSE format('{} successful requests routed here with no {} leg from this node (its'
                        || ' log is missing for them)', count(*), role)
       END
FROM coverage_missing_legs
GROUP BY role, node;

INSERT INTO findings_coverage
SELECT 'engine_only', l.node, count(*), min(l.started_at), max(l.started_at), 0, 0,
       format('{} engine legs with no client request (client logs missing for them)', count(*))
FROM orphan_legs l, detect_params p
WHERE (p.start_at IS NULL OR l.started_at >= p.start_at)
  AND (p.end_at IS NULL OR l.started_at <= p.end_at)
GROUP BY l.node;
