-- What the report shows of the whole traffic, summarised where the traffic is.
--
-- Everything after detection (scoping, the report, the notices) reads the findings and the
-- small evidence tables (tenants, pool_snapshots, evidence, rejects), never a table that grows
-- with the traffic. What the report needs of those tables beyond the findings is written here:
-- every tenant the requests name, the points of the tokens-against-TTFT chart (a sample by a
-- hash of the request id), and the arrival of each request whose KV another response read.
-- So a detection that ran where the evidence lies (Spark) leaves the report all it reads.

-- Every tenant the client requests name, and whether any of its requests is not excluded
-- (a customer's traffic). The report's redaction scrubs each of these ids from free text.
INSERT INTO findings_tenants
SELECT r.tenant_id, bool_or(x.request_id IS NULL) AS customer
FROM requests r
LEFT JOIN (SELECT DISTINCT request_id FROM findings_excluded) x USING (request_id)
WHERE r.tenant_id IS NOT NULL
GROUP BY r.tenant_id;

-- The chart's requests: a prompt length and a time to first token, inside the context window
-- (with no window known, every length).
CREATE OR REPLACE TEMP VIEW summary_ttft_requests AS
SELECT r.request_id, r.prompt_tokens,
       ttft_ms(r.ttft_ms, r.received_at, r.first_token_at) AS ttft_ms
FROM requests r, detect_params p
WHERE r.prompt_tokens > 0 AND ttft_ms(r.ttft_ms, r.received_at, r.first_token_at) > 0
  AND (p.context_length IS NULL OR r.prompt_tokens < p.context_length);

-- Flagged requests (each verdict row, excluded traffic marked) and the rest, each sampled by
-- a hash of the request id: the first $flagged_sample and $plain_sample in that order (a top-N
-- under the LIMIT, then numbered: a window over every request would sort them all).
INSERT INTO findings_ttft_sample
SELECT 'flagged', row_number() OVER (ORDER BY h, request_id, verdict, excluded_by NULLS FIRST),
       prompt_tokens, ttft_ms, verdict, excluded_by IS NOT NULL
FROM (SELECT md5(t.request_id) AS h, t.request_id, t.prompt_tokens, t.ttft_ms, a.verdict,
             a.excluded_by
      FROM summary_ttft_requests t JOIN findings_affected a USING (request_id)
      ORDER BY h, t.request_id, a.verdict, a.excluded_by NULLS FIRST
      LIMIT $flagged_sample);

INSERT INTO findings_ttft_sample
SELECT 'plain', row_number() OVER (ORDER BY h, request_id), prompt_tokens, ttft_ms, NULL, false
FROM (SELECT md5(t.request_id) AS h, t.request_id, t.prompt_tokens, t.ttft_ms
      FROM summary_ttft_requests t ANTI JOIN findings_affected a USING (request_id)
      ORDER BY h, t.request_id
      LIMIT $plain_sample);

-- The arrival of each request of a source tenant whose KV another response read: the notices
-- list a source's requests with it.
INSERT INTO findings_source_requests
SELECT r.request_id, r.tenant_id, min(r.received_at) AS received_at
FROM requests r
SEMI JOIN (SELECT DISTINCT source_request_id, source_tenant_id FROM findings_exposures
           WHERE source_excluded_by IS NULL) e
  ON e.source_request_id = r.request_id AND e.source_tenant_id = r.tenant_id
GROUP BY r.request_id, r.tenant_id;
