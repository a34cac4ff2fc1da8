-- over_pool: the prompt is at or above the max_req_input_len in force on its prefill node (on
-- every node, when its node is unknown), the client saw success, the prompt was under the
-- context length (else the tokenizer refused it) and the decode pool could hold it (else decode
-- refused it: no leak). A request with no client record is judged on its engine legs: the
-- prompt its decode leg reserved, answered when that leg completed (all_requests), so a lost
-- prefill log does not hide it. The shared part is answered_over_limits (prepare.sql).
SELECT
  request_id,
  prompt_tokens::DOUBLE AS value,
  threshold_tokens::DOUBLE AS threshold,
  format('prompt {} tokens >= limit {} ({}); {}',
         prompt_tokens, threshold_tokens, threshold_source, pools_detail) AS detail,
  evidence
FROM answered_over_limits($default_threshold_tokens, $context_length)
WHERE threshold_tokens IS NOT NULL AND prompt_tokens >= threshold_tokens
ORDER BY request_id;
