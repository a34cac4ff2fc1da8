-- The rules every step shares, as DuckDB macros created on every case connection. Each rule
-- lives here once; detectors, working views, assessments, the report and `explain` call it.

-- SGLang's max_req_input_len for a pool: min(context - 1, pool - 1) - 5 (a few tokens of the
-- window are kept in reserve). An unknown context leaves the pool's bound, an unknown pool the
-- context's: DuckDB's least() skips NULLs.
CREATE OR REPLACE TEMP MACRO sglang_input_limit(pool_tokens, context_length) AS
  least(context_length - 1, pool_tokens - 1) - 5;

-- The limit a pool snapshot states, else the one its pool implies.
CREATE OR REPLACE TEMP MACRO snapshot_input_limit(max_req_input_len, pool_tokens,
                                                   context_length) AS
  coalesce(max_req_input_len, sglang_input_limit(pool_tokens, context_length));

-- A limit below the engine's normal ceiling for the context (context - 6) was set by a pool
-- smaller than the window: the incident's cause. Unknown context: every limit counts as bound.
CREATE OR REPLACE TEMP MACRO pool_bound(limit_tokens, context_length) AS
  context_length IS NULL OR limit_tokens < sglang_input_limit(NULL, context_length);

-- SGLang's input-length rejection, as a prefill leg logs it, and the two numbers it states.
CREATE OR REPLACE TEMP MACRO input_length_rejection(error) AS
  regexp_matches(error, 'Input length \(\d+ tokens\) exceeds the maximum allowed length');
CREATE OR REPLACE TEMP MACRO rejected_input_tokens(error) AS
  TRY_CAST(regexp_extract(error, 'Input length \((\d+) tokens\)', 1) AS BIGINT);
CREATE OR REPLACE TEMP MACRO rejection_limit_tokens(error) AS
  TRY_CAST(regexp_extract(error, 'maximum allowed length \((\d+) tokens\)', 1) AS BIGINT);

-- Time to first token in milliseconds: the logged value, else from the two timestamps.
CREATE OR REPLACE TEMP MACRO ttft_ms(logged_ms, received_at, first_token_at) AS
  coalesce(logged_ms, date_diff('microsecond', received_at, first_token_at) / 1000.0);

-- One engine request's legs share a PD bootstrap room; without one, the rid.
CREATE OR REPLACE TEMP MACRO engine_key(bootstrap_room, request_id) AS
  coalesce('room:' || bootstrap_room, 'rid:' || request_id);

-- Engine legs whose rid names no client request, by row id, each with the client request its
-- PD bootstrap room names (client_request_id NULL when none does). With a client log loaded
-- nearly every leg's rid names its request, so this set is small: matching goes through it and
-- the legs themselves are never copied (with none loaded it holds every leg, as it must).
CREATE OR REPLACE TEMP MACRO unmatched_legs() AS TABLE
WITH unmatched AS (
  SELECT l.rowid AS leg_row, l.request_id, l.bootstrap_room
  FROM engine_legs l ANTI JOIN requests r ON l.request_id = r.request_id
)
SELECT u.leg_row, u.request_id, by_room.request_id AS client_request_id
FROM unmatched u
LEFT JOIN (SELECT request_id, bootstrap_room FROM requests
           WHERE bootstrap_room IN (SELECT bootstrap_room FROM unmatched)) by_room
  ON u.bootstrap_room = by_room.bootstrap_room;

-- Every engine leg with the client request it belongs to: by request id, else by the PD
-- bootstrap room (prefill and decode may log different rids for one request); NULL when
-- neither names one (the leg of an engine request with no client record: engine_requests).
-- A join on client_request_id leaves those out; a reader that does not join must. `unmatched`
-- names a table holding unmatched_legs() (detection keeps one; every reader shares it).
-- No filter here: DuckDB estimated the legs left by one at a few per cent of them, and a join
-- of the legs to the requests then built its hash table on the legs (at 100M requests, 200M
-- legs: out of memory under the 2 GB cap, where the requests side spills). Unfiltered, the
-- legs are estimated at what they are, more than the requests.
CREATE OR REPLACE TEMP MACRO legs_of_clients(unmatched) AS TABLE
SELECT CASE WHEN x.leg_row IS NULL THEN l.request_id ELSE x.client_request_id END
         AS client_request_id,
       l.*
FROM engine_legs l
LEFT JOIN query_table(unmatched) x ON l.rowid = x.leg_row;
