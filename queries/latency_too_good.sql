-- latency_too_good: time to first token far below what a prompt of that length costs.
-- The expected TTFT is fitted per model from the case's own traffic not flagged by the other
-- detectors: median log TTFT against median log prompt length in half-octave bins, a straight
-- line in log-log space. Prefill cost grows at least linearly with length, so the slope is
-- floored at 1; that keeps the extrapolation to very long prompts (all of them flagged, none
-- left to train on) from under-estimating the cost.
-- Length is what prefill had to compute: the prompt less its prefix-cache hit (cached_tokens).
-- A later turn of a conversation or agent reuses the context before it, so a long prompt can be
-- answered in a fraction of what computing it whole costs (in a real conversation trace a third
-- of the prompts of 32K tokens or more reused nine tenths of themselves). A prefill that
-- rejected the prompt computed nothing of it, cached or not.
WITH observed AS (
  SELECT r.request_id, coalesce(r.model, '') AS model, r.prompt_tokens,
         greatest(r.prompt_tokens - coalesce(r.cached_tokens, 0), 1) AS computed_tokens,
         coalesce(r.cached_tokens, 0) AS cached_tokens,
         ttft_ms(r.ttft_ms, r.received_at, r.first_token_at) AS ttft_ms,
         r.evidence_id, r.source_row
  FROM scoped_requests r
  WHERE r.http_status BETWEEN 200 AND 299 AND r.prompt_tokens > 0
),
training AS (
  SELECT * FROM observed
  WHERE ttft_ms > 0 AND computed_tokens >= $fit_min_prompt_tokens
    AND request_id NOT IN (SELECT request_id FROM detect_flagged)
),
bins AS (
  SELECT model, floor(log2(computed_tokens) * 2) AS bin,
         median(ln(computed_tokens)) AS log_tokens, median(ln(ttft_ms)) AS log_ttft
  FROM training
  GROUP BY model, bin
  HAVING count(*) >= $min_bin_requests
),
fit AS (
  SELECT model, greatest(regr_slope(log_ttft, log_tokens), 1.0) AS slope,
         avg(log_ttft) AS mean_y, avg(log_tokens) AS mean_x, count(*) AS bins
  FROM bins
  GROUP BY model
  HAVING count(*) >= 2
),
judged AS (
  SELECT o.*, exp(f.mean_y + f.slope * (ln(o.computed_tokens) - f.mean_x)) AS expected_ms,
         f.slope, f.bins
  FROM observed o JOIN fit f USING (model)
  WHERE o.computed_tokens >= $min_prompt_tokens AND o.ttft_ms IS NOT NULL
)
SELECT
  request_id,
  ttft_ms AS value,
  -- Rounded to the microsecond: the fit's last digits vary with DuckDB's parallel sums.
  round($latency_factor * expected_ms, 3) AS threshold,
  format('TTFT {} ms for {} prompt tokens{}; expected about {} ms (fit slope {}, {} bins)',
         round(ttft_ms, 1), prompt_tokens,
         CASE WHEN cached_tokens > 0 THEN format(' ({} of them cached)', cached_tokens) ELSE '' END,
         round(expected_ms, 0), round(slope, 2), bins)
    AS detail,
  to_json([{'table': 'requests', 'evidence_id': evidence_id, 'source_row': source_row}])
    AS evidence
FROM judged
WHERE ttft_ms < $latency_factor * expected_ms
ORDER BY request_id;
