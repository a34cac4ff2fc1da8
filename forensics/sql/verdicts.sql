-- Verdicts: one row per request with any signal.
--   confirmed: prefill_rejected, or over_pool with any other signal
--   likely:    over_pool alone, or token_mismatch on a long prompt
--   possible:  anything else (latency alone, a mismatch on a short prompt), and over_pool
--              alone when the request's own prefill leg shows the whole prompt processed
--              without a rejection: the limit on record (a stale or missing snapshot, the
--              default pool) was not the limit that node applied.
INSERT INTO findings_affected BY NAME
WITH flagged AS (SELECT DISTINCT request_id FROM findings_signals),
prefill_complete AS (
  SELECT l.client_request_id AS request_id
  FROM matched_legs l JOIN all_requests r ON r.request_id = l.client_request_id
  WHERE l.client_request_id IN (SELECT request_id FROM flagged)
    AND l.role IN ('prefill', 'unified')
    AND coalesce(l.input_tokens, l.transferred_tokens) >= r.prompt_tokens * $max_held_ratio
    AND (l.error IS NULL OR NOT regexp_matches(l.error, $rejection_pattern))
  GROUP BY l.client_request_id
),
per_request AS (
  SELECT request_id,
         list(DISTINCT signal ORDER BY signal) AS signals,
         max(threshold) FILTER (WHERE signal = 'over_pool') AS pool_threshold,
         max(threshold) FILTER (WHERE signal = 'prefill_rejected') AS logged_threshold,
         flatten(list(CAST(evidence AS STRUCT("table" VARCHAR, evidence_id INTEGER,
                                               source_row BIGINT)[]))) AS evidence
  FROM findings_signals
  GROUP BY request_id
)
SELECT r.request_id, r.tenant_id, r.received_at, r.prompt_tokens,
       coalesce(p.pool_threshold, p.logged_threshold)::BIGINT AS threshold_tokens,
       CASE
         WHEN list_contains(p.signals, 'prefill_rejected') THEN 'confirmed'
         WHEN list_contains(p.signals, 'over_pool') AND len(p.signals) > 1 THEN 'confirmed'
         WHEN list_contains(p.signals, 'over_pool') AND c.request_id IS NOT NULL THEN 'possible'
         WHEN list_contains(p.signals, 'over_pool') THEN 'likely'
         WHEN list_contains(p.signals, 'token_mismatch')
              AND r.prompt_tokens >= $long_prompt_tokens THEN 'likely'
         ELSE 'possible'
       END AS verdict,
       array_to_string(p.signals, ',') AS signals,
       r.model, r.prefill_node, r.decode_node, r.dp_rank,
       NULL::VARCHAR AS excluded_by,
       to_json(list_distinct(p.evidence)) AS evidence,
       CASE WHEN c.request_id IS NOT NULL AND p.signals = ['over_pool']
            THEN 'its prefill leg processed the whole prompt without a rejection:'
                 || ' the limit on record may not be the one the node applied'
       END AS note
FROM per_request p JOIN all_requests r USING (request_id)
LEFT JOIN prefill_complete c USING (request_id)
ORDER BY r.received_at, r.request_id;
