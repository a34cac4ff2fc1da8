-- Decode timeline: when each request took KV pages on a decode node (and rank) and when it gave
-- them back. Decode legs are the best record (prealloc time, release time, reserved tokens);
-- a successful request with a decode node but no decode leg falls back to its client times.
-- Legs with no client record belong to the engine request standing in for it (all_requests):
-- they held pages too, though their tenant and generated tokens may be unknown.
CREATE OR REPLACE TEMP TABLE decode_timeline AS
WITH legs AS (
  SELECT l.client_request_id AS request_id, r.tenant_id, l.node,
         coalesce(l.dp_rank, r.dp_rank) AS dp_rank,
         l.started_at AS alloc_at,
         coalesce(l.finished_at, r.completed_at,
                  r.received_at + to_microseconds(CAST(r.e2e_ms * 1000 AS BIGINT))) AS free_at,
         coalesce(l.reserved_tokens, r.prompt_tokens) AS prompt_tokens,
         coalesce(r.completion_tokens, 0) AS completion_tokens,
         'engine_legs' AS source_table, r.client_record, l.evidence_id, l.source_row
  FROM matched_legs l JOIN all_requests r ON r.request_id = l.client_request_id
  WHERE l.role IN ('decode', 'unified')
    AND coalesce(l.reserved_tokens, r.prompt_tokens) > 0
    AND l.error IS NULL
),
client_only AS (
  SELECT r.request_id, r.tenant_id, r.decode_node AS node, r.dp_rank,
         r.received_at AS alloc_at,
         coalesce(r.completed_at,
                  r.received_at + to_microseconds(CAST(r.e2e_ms * 1000 AS BIGINT))) AS free_at,
         r.prompt_tokens, coalesce(r.completion_tokens, 0) AS completion_tokens,
         'requests' AS source_table, true AS client_record, r.evidence_id, r.source_row
  FROM requests r
  WHERE r.decode_node IS NOT NULL AND r.http_status BETWEEN 200 AND 299
    AND r.request_id NOT IN (SELECT request_id FROM legs)
)
SELECT * FROM legs UNION ALL SELECT * FROM client_only;
