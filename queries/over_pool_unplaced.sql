-- over_pool_unplaced: a request whose prefill node no record names, its prompt at or over the
-- smallest limit in force on any prefill node but under the largest: some node would have
-- refused it (and decode then read stale pages), another would have served it whole. Answered,
-- under the context length and within its decode pool, as for over_pool (answered_over_limits,
-- prepare.sql). For review: the logs cannot say which node took it.
SELECT
  request_id,
  prompt_tokens::DOUBLE AS value,
  lowest_threshold_tokens::DOUBLE AS threshold,
  format('prompt {} tokens >= smallest prefill limit in force {} but < largest {}'
         || ' (prefill node unknown); {}',
         prompt_tokens, lowest_threshold_tokens, threshold_tokens, pools_detail) AS detail,
  evidence
FROM answered_over_limits($default_threshold_tokens, $context_length)
WHERE lowest_threshold_tokens IS NOT NULL AND prompt_tokens >= lowest_threshold_tokens
  AND (threshold_tokens IS NULL OR prompt_tokens < threshold_tokens)
ORDER BY request_id;
