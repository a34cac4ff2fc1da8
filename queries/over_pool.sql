-- over_pool: the prompt is at or above the max_req_input_len in force on its prefill node, the
-- client saw success, the prompt was under the context length (else the tokenizer refused it)
-- and the decode pool could hold it (else decode refused it: no leak).
WITH judged AS (
  -- The limit in force per request (prepare.sql), pre-filtered at the smallest limit seen.
  SELECT * FROM limits_in_force(0, $default_threshold_tokens, $context_length)
  WHERE http_status BETWEEN 200 AND 299
    AND coalesce(lower(finish_reason), '') <> 'abort'
),
with_decode AS (
  SELECT j.*, d.pool_tokens AS decode_pool_tokens, d.evidence_id AS decode_evidence_id,
         d.source_row AS decode_source_row
  FROM judged j
  ASOF LEFT JOIN decode_limits d
    ON j.decode_node = d.node AND j.received_at >= d.observed_at
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
FROM with_decode
WHERE threshold_tokens IS NOT NULL
  AND prompt_tokens >= threshold_tokens
  AND (context_ceiling IS NULL OR prompt_tokens < context_ceiling)
  AND (decode_pool_tokens IS NULL OR prompt_tokens <= decode_pool_tokens)
ORDER BY request_id;
