-- token_mismatch: an engine leg held far fewer tokens than the client was told it sent (or, with
-- no client record, than its decode leg reserved), and the request was answered.
-- Prefill: tokens held (or sent) well below the client's prompt_tokens. Decode: KV tokens
-- received well below the tokens it reserved for the prompt.
WITH legs AS (
  SELECT l.client_request_id, l.role, l.node, l.evidence_id, l.source_row,
         CASE WHEN l.role = 'decode' THEN l.transferred_tokens
              ELSE coalesce(l.input_tokens, l.transferred_tokens) END AS held_tokens,
         l.reserved_tokens
  FROM matched_legs l
),
compared AS (
  SELECT r.request_id, r.http_status, r.record_table, r.evidence_id AS r_eid,
         r.source_row AS r_row, g.*,
         CASE WHEN g.role = 'decode' THEN coalesce(g.reserved_tokens, r.prompt_tokens)
              ELSE r.prompt_tokens END AS expected_tokens
  FROM scoped_all r JOIN legs g ON g.client_request_id = r.request_id
  -- (A leg with no count fails the comparison below. Filtered out here, it would make DuckDB
  -- estimate the legs fewer than the requests and build the join's hash table on them.)
  WHERE r.answered
)
SELECT
  request_id,
  held_tokens::DOUBLE AS value,
  expected_tokens::DOUBLE AS threshold,
  format('{} leg on {} held {} of the {} tokens expected', role, node, held_tokens,
         expected_tokens) AS detail,
  to_json([
    {'table': record_table, 'evidence_id': r_eid, 'source_row': r_row},
    {'table': 'engine_legs', 'evidence_id': evidence_id, 'source_row': source_row}
  ]) AS evidence
FROM compared
WHERE held_tokens < expected_tokens * $max_held_ratio
  AND expected_tokens - held_tokens >= $min_missing_tokens
QUALIFY row_number() OVER (PARTITION BY request_id ORDER BY held_tokens, role, source_row) = 1
ORDER BY request_id;
