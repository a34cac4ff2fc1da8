-- rejection_unresolved: the prefill leg logged an input-length rejection for a request of which
-- the logs hold nothing else, no client record and no decode leg: whether it was answered (the
-- leak) or refused cannot be seen. Not an exposure on its own; a lead for review, so a lost
-- client log and a lost decode log together do not read as an all-clear.
SELECT
  r.request_id,
  TRY_CAST(regexp_extract(l.error, 'Input length \((\d+) tokens\)', 1) AS DOUBLE) AS value,
  TRY_CAST(regexp_extract(l.error, 'maximum allowed length \((\d+) tokens\)', 1) AS DOUBLE)
    AS threshold,
  format('prefill {} logged "{}"; no client record and no decode leg say whether it was'
         || ' answered', l.node, left(l.error, 160)) AS detail,
  to_json([{'table': 'engine_legs', 'evidence_id': l.evidence_id,
            'source_row': l.source_row}]) AS evidence
FROM scoped_all r
JOIN matched_legs l ON l.client_request_id = r.request_id
WHERE NOT r.client_record AND r.decode_node IS NULL
  AND l.role = 'prefill' AND input_length_rejection(l.error)
QUALIFY row_number() OVER (PARTITION BY r.request_id ORDER BY l.evidence_id, l.source_row) = 1
ORDER BY r.request_id;
