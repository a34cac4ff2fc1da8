-- Log coverage: what each side's evidence spans, where it has holes, and which requests one
-- side saw and the other did not. Conclusions are only as good as this table.
CREATE OR REPLACE TEMP TABLE coverage_series AS
SELECT 'requests' AS scope, NULL::VARCHAR AS node, received_at AS "at" FROM scoped_requests
UNION ALL
SELECT 'engine_legs', l.role || ':' || l.node, l.started_at
FROM engine_legs l, detect_params p
WHERE (p.start_at IS NULL OR l.started_at >= p.start_at)
  AND (p.end_at IS NULL OR l.started_at <= p.end_at);

INSERT INTO findings_coverage
WITH gaps AS (
  SELECT scope, node, "at",
         date_diff('millisecond', lag("at") OVER (PARTITION BY scope, node ORDER BY "at"), "at")
           / 1000.0 AS gap_s
  FROM coverage_series
)
SELECT scope, node, count(*), min("at"), max("at"),
       count(*) FILTER (WHERE gap_s > $gap_s),
       coalesce(max(gap_s), 0),
       format('{} rows; gaps longer than {} s: {}', count(*), $gap_s,
              count(*) FILTER (WHERE gap_s > $gap_s))
FROM gaps GROUP BY scope, node;

INSERT INTO findings_coverage
SELECT 'client_only', r.prefill_node, count(*), min(r.received_at), max(r.received_at), 0, 0,
       format('{} successful requests with no engine leg (engine logs missing for them)',
              count(*))
FROM scoped_requests r
WHERE r.http_status BETWEEN 200 AND 299
  AND (SELECT count(*) FROM engine_legs) > 0
  AND r.request_id NOT IN (SELECT client_request_id FROM matched_legs)
GROUP BY r.prefill_node;

INSERT INTO findings_coverage
SELECT 'engine_only', l.node, count(*), min(l.started_at), max(l.started_at), 0, 0,
       format('{} engine legs with no client request (client logs missing for them)', count(*))
FROM engine_legs l, detect_params p
WHERE l.request_id NOT IN (SELECT request_id FROM matched_legs)
  AND (p.start_at IS NULL OR l.started_at >= p.start_at)
  AND (p.end_at IS NULL OR l.started_at <= p.end_at)
GROUP BY l.node;
