-- Working views and tables every detector reads. Run once per detection, after
-- detect_params has been filled (one row, bound parameters, never string formatting).

-- Requests in scope: the incident window and model of the manifest. A request with no model
-- stays in scope: we cannot tell it was another model's.
CREATE OR REPLACE TEMP VIEW scoped_requests AS
SELECT r.*
FROM requests r, detect_params p
WHERE (p.model IS NULL OR r.model IS NULL OR r.model = p.model)
  AND (p.start_at IS NULL OR r.received_at >= p.start_at)
  AND (p.end_at IS NULL OR r.received_at <= p.end_at);

-- Prefill limits: one row per change of a prefill node's max_req_input_len, in force from
-- observed_at until the node's next row. Snapshot rows with no role count for both sides.
-- max_req_input_len falls back to the limit the pool implies (rules.sql) when not reported.
CREATE OR REPLACE TEMP TABLE prefill_limits AS
WITH snap AS (
  SELECT s.node, s.observed_at, s.max_total_num_tokens AS pool_tokens,
         coalesce(s.context_length, p.context_length) AS context_length,
         snapshot_input_limit(s.max_req_input_len, s.max_total_num_tokens,
                              coalesce(s.context_length, p.context_length)) AS threshold_tokens,
         'pool_snapshots' AS source_table, s.evidence_id, s.source_row
  FROM pool_snapshots s, detect_params p
  WHERE coalesce(s.role, 'prefill') IN ('prefill', 'unified')
),
-- Nodes with no snapshot at all still tell us their limit in each rejection they log.
logged AS (
  SELECT l.node, l.started_at AS observed_at, NULL::BIGINT AS pool_tokens,
         p.context_length,
         rejection_limit_tokens(l.error) AS threshold_tokens,
         'engine_legs' AS source_table, l.evidence_id, l.source_row
  FROM engine_legs l, detect_params p
  WHERE l.role IN ('prefill', 'unified') AND rejection_limit_tokens(l.error) IS NOT NULL
    AND l.node NOT IN (SELECT node FROM snap)
),
allrows AS (
  SELECT * FROM snap UNION ALL SELECT * FROM logged WHERE threshold_tokens IS NOT NULL
),
ordered AS (
  SELECT *, lag(threshold_tokens) OVER (PARTITION BY node ORDER BY observed_at, source_row)
              AS previous_threshold
  FROM allrows
)
SELECT node, observed_at, pool_tokens, context_length, threshold_tokens, source_table,
       evidence_id, source_row
FROM ordered
WHERE previous_threshold IS NULL OR previous_threshold <> threshold_tokens;

-- The smallest and the largest limit in force on any prefill node at each change point, for
-- requests whose prefill node is not recorded: over the largest, every node would have refused
-- the prompt (over_pool); over the smallest only, some node would have (over_pool_unplaced: for
-- review, since a node with a larger pool may have served it whole).
CREATE OR REPLACE TEMP TABLE prefill_limits_any AS
WITH times AS (SELECT DISTINCT observed_at FROM prefill_limits),
nodes AS (SELECT DISTINCT node FROM prefill_limits),
grid AS (SELECT t.observed_at, n.node FROM times t CROSS JOIN nodes n)
SELECT g.observed_at, min(l.threshold_tokens) AS threshold_tokens,
       max(l.threshold_tokens) AS largest_tokens,
       max(l.context_length) AS context_length
FROM grid g ASOF JOIN prefill_limits l ON g.node = l.node AND g.observed_at >= l.observed_at
GROUP BY g.observed_at;

-- Decode pools (per data-parallel rank), change points only.
CREATE OR REPLACE TEMP TABLE decode_limits AS
WITH snap AS (
  SELECT s.node, s.observed_at, s.max_total_num_tokens AS pool_tokens,
         coalesce(s.page_size, p.default_page_size) AS page_size, s.dp_size,
         s.evidence_id, s.source_row,
         lag(s.max_total_num_tokens) OVER w AS previous_pool,
         lag(coalesce(s.page_size, p.default_page_size)) OVER w AS previous_page
  FROM pool_snapshots s, detect_params p
  WHERE coalesce(s.role, 'decode') IN ('decode', 'unified')
  WINDOW w AS (PARTITION BY s.node ORDER BY s.observed_at, s.source_row)
)
SELECT node, observed_at, pool_tokens, page_size, dp_size, evidence_id, source_row
FROM snap
WHERE previous_pool IS NULL OR previous_pool <> pool_tokens OR previous_page <> page_size;

-- Engine legs matched to the client request they belong to (rules.sql: legs_of_clients). A
-- view: the unmatched few are kept, and each reader joins the legs to them.
CREATE OR REPLACE TEMP TABLE leg_unmatched AS FROM unmatched_legs();
CREATE OR REPLACE TEMP VIEW client_legs AS FROM legs_of_clients('leg_unmatched');

-- Engine requests with no client record (a lost or missing client log): the legs of one request
-- grouped by bootstrap room, else by rid. The engine alone proves an exposure (a prefill that
-- logged the rejection, or a decode that received far less than it reserved, followed by a
-- decode leg that completed), so these stand in for the client record. The tenant comes from a
-- `tenant_id` field the legs carry (kept in `extra`, e.g. a custom request label), else unknown.
-- A leg matched by neither rid nor room whose rid another leg's room matched belongs to that
-- client request's engine work, not to a request of its own.
CREATE OR REPLACE TEMP TABLE orphan_legs AS
SELECT engine_key(l.bootstrap_room, l.request_id) AS engine_key, l.*
FROM engine_legs l
SEMI JOIN (SELECT leg_row FROM leg_unmatched
           WHERE client_request_id IS NULL
             AND request_id NOT IN (SELECT request_id FROM leg_unmatched
                                    WHERE client_request_id IS NOT NULL)) o
  ON l.rowid = o.leg_row;

CREATE OR REPLACE TEMP TABLE engine_requests AS
WITH orphan AS (SELECT * FROM orphan_legs),
decode AS (
  SELECT engine_key, arg_min(l, (l.started_at, l.source_row)) AS d
  FROM orphan l WHERE l.role IN ('decode', 'unified') GROUP BY engine_key
),
prefill AS (
  SELECT engine_key, arg_min(l, (l.started_at, l.source_row)) AS p
  FROM orphan l WHERE l.role = 'prefill' GROUP BY engine_key
),
labels AS (
  SELECT engine_key, min(json_extract_string(extra, '$.tenant_id')) AS tenant_id
  FROM orphan GROUP BY engine_key
)
SELECT coalesce(d.d.request_id, p.p.request_id) AS request_id, g.tenant_id,
       least(p.p.started_at, d.d.started_at) AS received_at,
       coalesce(d.d.reserved_tokens,
                rejected_input_tokens(p.p.error),
                p.p.input_tokens) AS prompt_tokens,
       NULL::BIGINT AS http_status,
       d.d.finished_at AS completed_at,
       -- What the engine logged it generated (an SGLang decode leg's meta_info does): the
       -- replay sizes the allocation with it when no client record says.
       TRY_CAST(json_extract_string(d.d.extra, '$.completion_tokens') AS BIGINT)
         AS completion_tokens,
       p.p.node AS prefill_node, d.d.node AS decode_node, d.d.dp_rank AS dp_rank,
       coalesce(d.d.bootstrap_room, p.p.bootstrap_room) AS bootstrap_room,
       -- A decode leg that finished without an error generated an answer: in PD the client
       -- receives it (that is the incident: nothing errored).
       d.d.finished_at IS NOT NULL AND d.d.error IS NULL
         AND coalesce(d.d.status_code, 200) BETWEEN 200 AND 299
         AND coalesce(lower(d.d.finish_type), '') <> 'abort' AS answered,
       false AS client_record, 'engine_legs' AS record_table,
       coalesce(d.d.evidence_id, p.p.evidence_id) AS evidence_id,
       coalesce(d.d.source_row, p.p.source_row) AS source_row,
       k.engine_key
FROM (SELECT DISTINCT engine_key FROM orphan) k
LEFT JOIN decode d USING (engine_key)
LEFT JOIN prefill p USING (engine_key)
LEFT JOIN labels g USING (engine_key);

-- Legs matched to their request: the client's, else the engine request standing in for it
-- (an engine request's legs come once more from client_legs with no client request: every
-- reader joins on client_request_id or asks for given ones, which leaves those out).
-- A view: copying every client leg again would cost more than reading them twice.
CREATE OR REPLACE TEMP VIEW matched_legs AS
SELECT * FROM client_legs
UNION ALL
SELECT e.request_id AS client_request_id, l.* EXCLUDE (engine_key)
FROM orphan_legs l
JOIN engine_requests e USING (engine_key);

-- Every request the case knows: client records, then engine requests that have none. Client
-- records answer `answered` from the HTTP status the client saw.
CREATE OR REPLACE TEMP VIEW all_requests AS
SELECT r.*, r.http_status BETWEEN 200 AND 299 AS answered, true AS client_record,
       'requests' AS record_table
FROM requests r
UNION ALL BY NAME
SELECT * EXCLUDE (engine_key) FROM engine_requests;

-- All requests in scope (see scoped_requests): what the engine-backed detectors read.
CREATE OR REPLACE TEMP VIEW scoped_all AS
SELECT r.*
FROM all_requests r, detect_params p
WHERE (p.model IS NULL OR r.model IS NULL OR r.model = p.model)
  AND (p.start_at IS NULL OR r.received_at >= p.start_at)
  AND (p.end_at IS NULL OR r.received_at <= p.end_at);

-- The prefill limit in force for every request at or near one: the single lookup that over_pool
-- and the exploitation assessment share. A request with no prefill node on its client record
-- takes the node from its engine legs; a node no snapshot covers takes the limit implied by
-- default_pool_tokens; with no node at all, the largest limit in force on any node (whichever
-- node took it refused it), and `lowest_threshold_tokens` the smallest (some node would have).
-- `band` widens the cheap pre-filter below the smallest limit (0 for over_pool).
-- `engine_records` adds the engine requests with no client record (all_requests), whose prompt
-- is what their decode leg reserved: over_pool judges them, the exploitation assessment (a
-- tenant's own prompts, from the client log) does not.
CREATE OR REPLACE TEMP MACRO limits_in_force(band, default_limit, advertised_context,
                                             engine_records) AS TABLE
WITH floor AS (
  SELECT least((SELECT min(threshold_tokens) FROM prefill_limits), default_limit) * (1 - band)
           AS tokens
),
near AS (
  SELECT r.* FROM scoped_all r, floor f
  WHERE r.prompt_tokens >= f.tokens AND (r.client_record OR engine_records)
),
placed AS (
  SELECT client_request_id,
         min(node) FILTER (WHERE role IN ('prefill', 'unified')) AS leg_prefill_node,
         min(node) FILTER (WHERE role IN ('decode', 'unified')) AS leg_decode_node
  FROM matched_legs
  WHERE client_request_id IN (SELECT request_id FROM near)
  GROUP BY client_request_id
),
located AS (
  SELECT n.* REPLACE (coalesce(n.prefill_node, p.leg_prefill_node) AS prefill_node,
                      coalesce(n.decode_node, p.leg_decode_node) AS decode_node)
  FROM near n LEFT JOIN placed p ON p.client_request_id = n.request_id
),
with_node AS (
  SELECT c.*, l.threshold_tokens AS node_threshold, l.context_length AS node_context,
         l.source_table AS limit_table, l.evidence_id AS limit_evidence_id,
         l.source_row AS limit_source_row
  FROM located c
  ASOF LEFT JOIN prefill_limits l
    ON c.prefill_node = l.node AND c.received_at >= l.observed_at
),
with_any AS (
  SELECT w.*, a.threshold_tokens AS any_threshold, a.largest_tokens AS any_largest,
         a.context_length AS any_context,
         w.node_threshold IS NULL AND (w.prefill_node IS NULL OR default_limit IS NULL)
           AS node_unknown
  FROM with_node w
  ASOF LEFT JOIN prefill_limits_any a ON w.received_at >= a.observed_at
)
SELECT * EXCLUDE (node_unknown),
  CASE
    WHEN NOT node_unknown THEN coalesce(node_threshold, default_limit)
    ELSE coalesce(any_largest, default_limit)
  END AS threshold_tokens,
  CASE
    WHEN node_threshold IS NOT NULL THEN limit_table
    WHEN NOT node_unknown THEN 'default_pool_tokens'
    WHEN any_largest IS NOT NULL THEN 'largest prefill limit in force (node unknown)'
    ELSE 'default_pool_tokens'
  END AS threshold_source,
  CASE WHEN node_unknown THEN coalesce(any_threshold, default_limit) END
    AS lowest_threshold_tokens,
  coalesce(node_context, advertised_context, any_context) AS context_ceiling
FROM with_any;

-- Answered requests over a prefill limit, below the context ceiling, that their decode pool
-- could hold (else the tokenizer or decode refused them: no leak), each with the decode pool in
-- force and the evidence rows it rests on. over_pool takes those at or over the limit in force
-- (every node's when the node is unknown); over_pool_unplaced those whose unknown node may or
-- may not have refused them (no limit row of their own: the node is unknown).
CREATE OR REPLACE TEMP MACRO answered_over_limits(default_limit, advertised_context) AS TABLE
WITH judged AS (
  SELECT * FROM limits_in_force(0, default_limit, advertised_context, true)
  WHERE answered AND coalesce(lower(finish_reason), '') <> 'abort'
    AND prompt_tokens >= coalesce(lowest_threshold_tokens, threshold_tokens)
),
with_decode AS (
  SELECT j.*, d.pool_tokens AS decode_pool_tokens, d.evidence_id AS decode_evidence_id,
         d.source_row AS decode_source_row
  FROM judged j
  ASOF LEFT JOIN decode_limits d
    ON j.decode_node = d.node AND j.received_at >= d.observed_at
)
SELECT *,
  format('decode pool {}; context {}', coalesce(decode_pool_tokens::VARCHAR, 'unknown'),
         coalesce(context_ceiling::VARCHAR, 'unknown')) AS pools_detail,
  to_json(list_filter([
    {'table': record_table, 'evidence_id': evidence_id, 'source_row': source_row},
    {'table': limit_table, 'evidence_id': limit_evidence_id, 'source_row': limit_source_row},
    {'table': 'pool_snapshots', 'evidence_id': decode_evidence_id,
     'source_row': decode_source_row}
  ], lambda e: e.evidence_id IS NOT NULL)) AS evidence
FROM with_decode
WHERE (context_ceiling IS NULL OR prompt_tokens < context_ceiling)
  AND (decode_pool_tokens IS NULL OR prompt_tokens <= decode_pool_tokens);

CREATE OR REPLACE TEMP TABLE detect_flagged (request_id VARCHAR);
