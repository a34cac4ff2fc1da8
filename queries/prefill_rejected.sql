-- prefill_rejected: the prefill leg logged an input-length rejection, yet the request was
-- answered: the client got a 2xx, or (no client record) its decode leg completed. The
-- rejection was only pending; the request went on to decode over stale pages.
WITH rejected AS (
  SELECT l.client_request_id, l.node, l.error, l.evidence_id, l.source_row,
         TRY_CAST(regexp_extract(l.error, 'Input length \((\d+) tokens\)', 1) AS BIGINT)
           AS logged_tokens,
         TRY_CAST(regexp_extract(l.error, 'maximum allowed length \((\d+) tokens\)', 1) AS BIGINT)
           AS logged_limit
  FROM matched_legs l
  WHERE l.role IN ('prefill', 'unified') AND input_length_rejection(l.error)
)
SELECT
  r.request_id,
  coalesce(x.logged_tokens, r.prompt_tokens)::DOUBLE AS value,
  x.logged_limit::DOUBLE AS threshold,
  format('prefill {} logged "{}" but {}', x.node, left(x.error, 160),
         CASE WHEN r.client_record THEN format('the client got HTTP {}', r.http_status)
              ELSE format('its decode leg on {} completed (no client record)', r.decode_node)
         END) AS detail,
  to_json([
    {'table': r.record_table, 'evidence_id': r.evidence_id, 'source_row': r.source_row},
    {'table': 'engine_legs', 'evidence_id': x.evidence_id, 'source_row': x.source_row}
  ]) AS evidence
FROM scoped_all r
JOIN rejected x ON x.client_request_id = r.request_id
WHERE r.answered
QUALIFY row_number() OVER (PARTITION BY r.request_id ORDER BY x.evidence_id, x.source_row) = 1
ORDER BY r.request_id;
