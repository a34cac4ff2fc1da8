-- Verdicts: one row per request with any signal, the strongest its signals give. How each
-- signal weighs is declared in its detector's metadata (`verdict:`), e.g. over_pool: confirmed
-- with another signal, possible when the request's own prefill leg shows the whole prompt
-- processed without a rejection (the limit on record, a stale or missing snapshot or the
-- default pool, was not the one the node applied), else likely. `limit_from_threshold`
-- marks the signals whose threshold is the input limit; the lowest rank names it.
INSERT INTO findings_affected BY NAME
WITH flagged AS (SELECT DISTINCT request_id FROM findings_signals),
prefill_complete AS (
  SELECT l.client_request_id AS request_id
  FROM matched_legs l JOIN all_requests r ON r.request_id = l.client_request_id
  WHERE l.client_request_id IN (SELECT request_id FROM flagged)
    AND l.role IN ('prefill', 'unified')
    AND coalesce(l.input_tokens, l.transferred_tokens) >= r.prompt_tokens * $max_held_ratio
    AND (l.error IS NULL OR NOT input_length_rejection(l.error))
  GROUP BY l.client_request_id
),
-- Each signal's verdict by its detector's declared rules (detector_effects, from the
-- metadata): the first rule that applies decides.
per_signal AS (
  SELECT s.request_id, s.signal, s.threshold, e.limit_rank, s.evidence,
         count(*) OVER (PARTITION BY s.request_id) AS n_signals,
         c.request_id IS NOT NULL AS prefill_complete, r.prompt_tokens,
         e.with_other_signal, e.if_prefill_complete, e.if_long_prompt, e.base
  FROM (SELECT request_id, signal, max(threshold) AS threshold,
               flatten(list(CAST(evidence AS STRUCT("table" VARCHAR, evidence_id INTEGER,
                                                     source_row BIGINT)[]))) AS evidence
        FROM findings_signals GROUP BY request_id, signal) s
  JOIN detector_effects e USING (signal)
  JOIN all_requests r USING (request_id)
  LEFT JOIN prefill_complete c USING (request_id)
),
ruled AS (
  SELECT *,
         CASE WHEN with_other_signal IS NOT NULL AND n_signals > 1 THEN 'with_other_signal'
              WHEN if_prefill_complete IS NOT NULL AND prefill_complete
                THEN 'if_prefill_complete'
              WHEN if_long_prompt IS NOT NULL AND prompt_tokens >= $long_prompt_tokens
                THEN 'if_long_prompt'
              ELSE 'base' END AS rule
  FROM per_signal
),
per_request AS (
  SELECT request_id,
         list(signal ORDER BY signal) AS signals,
         verdict_at(min(verdict_rank(CASE rule WHEN 'with_other_signal' THEN with_other_signal
                                               WHEN 'if_prefill_complete' THEN if_prefill_complete
                                               WHEN 'if_long_prompt' THEN if_long_prompt
                                               ELSE base END))) AS verdict,
         bool_or(rule = 'if_prefill_complete') AS lowered_by_prefill,
         arg_min(threshold, limit_rank) FILTER (WHERE limit_rank IS NOT NULL) AS limit_tokens,
         flatten(list(evidence)) AS evidence
  FROM ruled
  GROUP BY request_id
)
SELECT r.request_id, r.tenant_id, r.received_at, r.prompt_tokens,
       p.limit_tokens::BIGINT AS threshold_tokens,
       p.verdict,
       array_to_string(p.signals, ',') AS signals,
       r.model, r.prefill_node, r.decode_node, r.dp_rank,
       NULL::VARCHAR AS excluded_by,
       -- Sorted: a distinct list comes back in no set order, and outputs must not vary.
       to_json(list_sort(list_distinct(p.evidence))) AS evidence,
       CASE WHEN p.lowered_by_prefill
            THEN 'its prefill leg processed the whole prompt without a rejection:'
                 || ' the limit on record may not be the one the node applied'
       END AS note
FROM per_request p JOIN all_requests r USING (request_id)
ORDER BY r.received_at, r.request_id;
