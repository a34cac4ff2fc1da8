-- Temporal attribution: the fallback when a decode rank's pool cannot be replayed (both tiers),
-- and the candidates added to a replay that had drifted (the overlap window only: the replay
-- still named most writers, so only recent releases are plausible misses).
CREATE OR REPLACE TEMP TABLE temporal_victims AS
SELECT request_id, tenant_id, node, dp_rank, alloc_at
FROM decode_timeline
WHERE request_id IN (SELECT unnest($victims))
  AND alloc_at IS NOT NULL
  AND alloc_at - to_microseconds(CAST($window_s * 1e6 AS BIGINT)) IS NOT NULL;

CREATE OR REPLACE TEMP TABLE temporal_recent AS
SELECT v.request_id AS vid, v.tenant_id AS vt, c.request_id, c.tenant_id, c.free_at,
       c.prompt_tokens + c.completion_tokens AS tokens
FROM temporal_victims v
JOIN decode_timeline c
  ON c.node = v.node
 AND (v.dp_rank IS NULL OR c.dp_rank = v.dp_rank)
 AND c.free_at <= v.alloc_at
 AND c.free_at >= v.alloc_at - to_microseconds(CAST($window_s * 1e6 AS BIGINT))
 AND c.request_id <> v.request_id;

-- Each tenant's latest release on the victim's node (and rank) before the victim: an as-of
-- join per (victim, tenant seen on that node) instead of every earlier request.
CREATE OR REPLACE TEMP TABLE temporal_older AS
WITH releases AS (
  SELECT node, coalesce(dp_rank, -1) AS rank_key, tenant_id, request_id, free_at,
         prompt_tokens + completion_tokens AS tokens
  -- Not wanted for a drifted replay's victims: then nothing is read at all.
  FROM decode_timeline WHERE free_at IS NOT NULL AND $include_older
),
node_releases AS (
  -- Victims with no rank recorded are matched on the node alone.
  SELECT node, -2 AS rank_key, tenant_id, request_id, free_at, tokens FROM releases
),
all_releases AS (SELECT * FROM releases UNION ALL SELECT * FROM node_releases),
pairs AS (
  SELECT v.request_id AS vid, v.tenant_id AS vt, v.node,
         coalesce(v.dp_rank, -2) AS rank_key, v.alloc_at, t.tenant_id
  FROM temporal_victims v
  JOIN (SELECT DISTINCT node, rank_key, tenant_id FROM all_releases) t
    ON t.node = v.node AND t.rank_key = coalesce(v.dp_rank, -2)
)
SELECT p.vid, p.vt, r.request_id, r.tenant_id, r.free_at, r.tokens
FROM pairs p
ASOF JOIN all_releases r
  ON r.node = p.node AND r.rank_key = p.rank_key AND r.tenant_id = p.tenant_id
 AND p.alloc_at >= r.free_at
WHERE r.request_id <> p.vid
  AND NOT EXISTS (SELECT 1 FROM temporal_recent x
                  WHERE x.vid = p.vid AND x.tenant_id = r.tenant_id);

INSERT INTO findings_exposures
WITH tiers AS (
  SELECT vid, vt, request_id, tenant_id, free_at, tokens, 1 AS tier, 'low' AS confidence
  FROM temporal_recent
  UNION ALL
  SELECT vid, vt, request_id, tenant_id, free_at, tokens, 2, 'very_low' FROM temporal_older
  WHERE $include_older
)
SELECT vid, vt, request_id, tenant_id, 'temporal', tokens, confidence,
       row_number() OVER (PARTITION BY vid ORDER BY tier, free_at DESC, request_id),
       free_at, NULL, NULL
FROM tiers t
-- Where an (approximate) replay already named a tenant for this victim, keep its row only.
WHERE NOT EXISTS (SELECT 1 FROM findings_exposures e
                  WHERE e.recipient_request_id = t.vid AND e.source_tenant_id = t.tenant_id);
