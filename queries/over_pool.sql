-- over_pool: the prompt is at or above the max_req_input_len in force on its prefill node, the
-- client saw success, the prompt was under the context length (else the tokenizer refused it)
-- and the decode pool could hold it (else decode refused it: no leak).
WITH floor AS (
  -- Cheapest filter first: nothing below the smallest limit ever seen can be over the pool.
  SELECT least((SELECT min(threshold_tokens) FROM prefill_limits),
               $default_threshold_tokens) AS tokens
),
long_ok AS (
  SELECT r.*
  FROM scoped_requests r, floor f
  WHERE r.prompt_tokens >= f.tokens
    AND r.http_status BETWEEN 200 AND 299
    AND coalesce(lower(r.finish_reason), '') <> 'abort'
),
-- Where the client record does not say where the request ran, its engine legs may.
placed AS (
  SELECT client_request_id,
         min(node) FILTER (WHERE role IN ('prefill', 'unified')) AS leg_prefill_node,
         min(node) FILTER (WHERE role IN ('decode', 'unified')) AS leg_decode_node
  FROM matched_legs
  WHERE client_request_id IN (SELECT request_id FROM long_ok)
  GROUP BY client_request_id
),
candidates AS (
  SELECT o.* REPLACE (coalesce(o.prefill_node, p.leg_prefill_node) AS prefill_node,
                      coalesce(o.decode_node, p.leg_decode_node) AS decode_node)
  FROM long_ok o LEFT JOIN placed p ON p.client_request_id = o.request_id
),
with_node AS (
  SELECT c.*, l.threshold_tokens AS node_threshold, l.context_length AS node_context,
         l.source_table AS limit_table, l.evidence_id AS limit_evidence_id,
         l.source_row AS limit_source_row
  FROM candidates c
  ASOF LEFT JOIN prefill_limits l
    ON c.prefill_node = l.node AND c.received_at >= l.observed_at
),
with_any AS (
  SELECT w.*, a.threshold_tokens AS any_threshold, a.context_length AS any_context
  FROM with_node w
  ASOF LEFT JOIN prefill_limits_any a ON w.received_at >= a.observed_at
),
with_decode AS (
  SELECT w.*, d.pool_tokens AS decode_pool_tokens, d.evidence_id AS decode_evidence_id,
         d.source_row AS decode_source_row
  FROM with_any w
  ASOF LEFT JOIN decode_limits d
    ON w.decode_node = d.node AND w.received_at >= d.observed_at
),
judged AS (
  SELECT *,
    CASE
      WHEN node_threshold IS NOT NULL THEN node_threshold
      WHEN prefill_node IS NOT NULL AND $default_threshold_tokens IS NOT NULL
        THEN $default_threshold_tokens
      ELSE coalesce(any_threshold, $default_threshold_tokens)
    END AS threshold_tokens,
    CASE
      WHEN node_threshold IS NOT NULL THEN limit_table
      WHEN prefill_node IS NOT NULL AND $default_threshold_tokens IS NOT NULL
        THEN 'default_pool_tokens'
      WHEN any_threshold IS NOT NULL THEN 'smallest prefill limit in force (node unknown)'
      ELSE 'default_pool_tokens'
    END AS threshold_source,
    coalesce(node_context, $context_length, any_context) AS context_ceiling
  FROM with_decode
)
SELECT
  request_id,
  prompt_tokens::DOUBLE AS value,
  threshold_tokens::DOUBLE AS threshold,
  format('prompt {} tokens >= limit {} ({}); decode pool {}; context {}',
         prompt_tokens, threshold_tokens, threshold_source,
         coalesce(decode_pool_tokens::VARCHAR, 'unknown'),
         coalesce(context_ceiling::VARCHAR, 'unknown')) AS detail,
  to_json(list_filter([
    {'table': 'requests', 'evidence_id': evidence_id, 'source_row': source_row},
    {'table': limit_table, 'evidence_id': limit_evidence_id, 'source_row': limit_source_row},
    {'table': 'pool_snapshots', 'evidence_id': decode_evidence_id,
     'source_row': decode_source_row}
  ], lambda e: e.evidence_id IS NOT NULL)) AS evidence
FROM judged
WHERE threshold_tokens IS NOT NULL
  AND prompt_tokens >= threshold_tokens
  AND (context_ceiling IS NULL OR prompt_tokens < context_ceiling)
  AND (decode_pool_tokens IS NULL OR prompt_tokens <= decode_pool_tokens)
ORDER BY request_id;
