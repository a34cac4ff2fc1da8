-- Decode timeline: when each request took KV pages on a decode node (and rank) and when it gave
-- them back. Decode legs are the best record (prealloc time, release time, reserved tokens);
-- a successful request with a decode node but no decode leg falls back to its client times.
-- Legs with no client record belong to the engine request standing in for it (all_requests):
-- they held pages too, though their tenant and generated tokens may be unknown.
-- One join for both: every request with its decode legs that held pages, and a request with
-- none falls back to its client record.
CREATE OR REPLACE TEMP TABLE decode_timeline AS
WITH legs AS (
  SELECT client_request_id, node, dp_rank, started_at, finished_at, reserved_tokens,
         CASE WHEN role = 'decode'
              THEN TRY_CAST(json_extract_string(extra, '$.prealloc_wait_s') AS DOUBLE) END
           AS prealloc_wait_s
  FROM matched_legs
  -- An engine request's legs come twice, once without a client_request_id: that copy would
  -- stand beside its twin as a leg admitted with it.
  WHERE role IN ('decode', 'unified') AND error IS NULL AND client_request_id IS NOT NULL
),
-- A decode leg whose allocation instant an adapter rebuilt from logged durations (SGLang's
-- time stats: to 10 microseconds each, so to some 30 microseconds in all) may be placed a few
-- microseconds before another admitted with it, when the queue admitted it after. The
-- preallocation queue admits first in, first out, and each leg's wait says when it entered:
-- legs allocated within that error of one another on a rank are one admission, and the k-th
-- of them to enter the queue takes the k-th of their instants (made strictly increasing, so
-- that no tie falls back to request-id order). The set of instants is unchanged, so their
-- order against every release stays as logged. Legs with no such wait keep their time.
gaps AS (
  SELECT *,
         started_at - lag(started_at) OVER (PARTITION BY node, dp_rank
                                            ORDER BY started_at, client_request_id) AS gap_before,
         lead(started_at) OVER (PARTITION BY node, dp_rank
                                ORDER BY started_at, client_request_id) - started_at AS gap_after
  FROM legs
  WHERE prealloc_wait_s IS NOT NULL
),
waited AS (
  SELECT *,
         coalesce(gap_before <= to_microseconds(30), false) AS joins_previous,
         coalesce(gap_before <= to_microseconds(30) OR gap_after <= to_microseconds(30), false)
           AS admitted_with_others
  FROM gaps
),
together AS (
  SELECT *,
         started_at - to_microseconds(CAST(prealloc_wait_s * 1000000 AS BIGINT)) AS entered_at,
         sum(CASE WHEN joins_previous THEN 0 ELSE 1 END)
           OVER (PARTITION BY node, dp_rank ORDER BY started_at, client_request_id
                 ROWS UNBOUNDED PRECEDING) AS admission
  FROM waited
  WHERE admitted_with_others
),
placed AS (
  SELECT *,
         row_number() OVER (PARTITION BY node, dp_rank, admission
                            ORDER BY started_at, client_request_id) AS by_time,
         row_number() OVER (PARTITION BY node, dp_rank, admission
                            ORDER BY entered_at, client_request_id) AS by_entry,
         coalesce(entered_at - lag(entered_at) OVER (PARTITION BY node, dp_rank, admission
                                                     ORDER BY entered_at, client_request_id)
                    <= to_microseconds(100), false) AS near_previous,
         coalesce(lead(entered_at) OVER (PARTITION BY node, dp_rank, admission
                                         ORDER BY entered_at, client_request_id) - entered_at
                    <= to_microseconds(100), false) AS near_next
  FROM together
),
-- A queue entry is an instant less a wait, each rebuilt from durations rounded to 10
-- microseconds: some 50 microseconds off in all. Legs of one admission that entered within
-- twice that of one another may have entered in either order, and which pages each took
-- follows that order. Such legs form a queue run (an id unique within the rank; NULL for every
-- other row), and the replay tries the run's other order too (forensics/replay.py).
queued AS (
  SELECT *,
         CASE WHEN near_previous OR near_next
              THEN CAST(admission * 1048576
                        + sum(CASE WHEN near_previous THEN 0 ELSE 1 END)
                            OVER (PARTITION BY node, dp_rank, admission ORDER BY by_entry
                                  ROWS UNBOUNDED PRECEDING) AS BIGINT)
         END AS queue_run
  FROM placed
),
instants AS (
  -- The admission's k-th instant, at least a microsecond after the one before it.
  SELECT node, dp_rank, admission, by_time,
         max(started_at - to_microseconds(by_time)) OVER (
           PARTITION BY node, dp_rank, admission ORDER BY by_time ROWS UNBOUNDED PRECEDING)
           + to_microseconds(by_time) AS at
  FROM placed
),
decode_legs AS (
  SELECT client_request_id, node, dp_rank, started_at, finished_at, reserved_tokens,
         NULL::BIGINT AS queue_run
  FROM legs WHERE prealloc_wait_s IS NULL
  UNION ALL
  SELECT client_request_id, node, dp_rank, started_at, finished_at, reserved_tokens, NULL
  FROM waited
  WHERE NOT admitted_with_others
  UNION ALL
  SELECT p.client_request_id, p.node, p.dp_rank, least(i.at, p.finished_at), p.finished_at,
         p.reserved_tokens, p.queue_run
  FROM queued p
  JOIN instants i
    ON i.node = p.node AND i.dp_rank IS NOT DISTINCT FROM p.dp_rank AND i.admission = p.admission
   AND i.by_time = p.by_entry
)
SELECT r.request_id, r.tenant_id,
       CASE WHEN l.client_request_id IS NULL THEN r.decode_node ELSE l.node END AS node,
       coalesce(l.dp_rank, r.dp_rank) AS dp_rank,
       CASE WHEN l.client_request_id IS NULL THEN r.received_at ELSE l.started_at END AS alloc_at,
       coalesce(l.finished_at, r.completed_at,
                r.received_at + to_microseconds(CAST(r.e2e_ms * 1000 AS BIGINT))) AS free_at,
       coalesce(l.reserved_tokens, r.prompt_tokens) AS prompt_tokens,
       coalesce(r.completion_tokens, 0) AS completion_tokens,
       CASE WHEN l.client_request_id IS NULL THEN 'requests' ELSE 'engine_legs' END
         AS source_table,
       -- Timed by its arrival, the allocation may have waited for room, but not past the first
       -- token the client received (decode sends it once the KV it allocated for has come).
       CASE WHEN l.client_request_id IS NULL
            THEN coalesce(r.first_token_at,
                          r.received_at + to_microseconds(CAST(r.ttft_ms * 1000 AS BIGINT)))
       END AS admit_by,
       -- The allocation's size is known: the generated tokens come from the client record, or
       -- from the engine's own count when it has none.
       r.client_record OR r.completion_tokens IS NOT NULL AS size_known,
       l.queue_run
FROM all_requests r
LEFT JOIN decode_legs l
  ON l.client_request_id = r.request_id AND coalesce(l.reserved_tokens, r.prompt_tokens) > 0
WHERE l.client_request_id IS NOT NULL
   OR (r.client_record AND r.decode_node IS NOT NULL AND r.http_status BETWEEN 200 AND 299)
-- In replay order: each decode rank's rows together (node, then rank, none first), by
-- allocation. The replay reads a rank as a range of row ids of this table: one sort of the
-- timeline, where a sorted copy of the replayed ranks' rows cost a second one.
ORDER BY node NULLS LAST, dp_rank NULLS FIRST, alloc_at NULLS LAST, request_id;
