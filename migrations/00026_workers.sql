-- +goose Up
-- Live workers (docs/operations.md "Live workers"). Every Client with queues
-- keeps one row here: it upserts it at start and every heartbeat interval
-- (store.Heartbeat, one statement) and deletes it at a clean Stop. A row
-- whose heartbeat is older than WorkerStaleBeats (3) of its own intervals
-- belongs to a dead process: readers skip it and the next heartbeat of any
-- worker deletes it. No payload, no secret: identity, queues and counts.
CREATE TABLE pgoutbox.workers (
    id text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 256),
    host text NOT NULL CHECK (length(host) <= 256),
    pid integer NOT NULL,
    version text NOT NULL DEFAULT '' CHECK (length(version) <= 128),
    queues text[] NOT NULL,
    concurrency integer[] NOT NULL,
    in_flight integer NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    heartbeat_interval_s double precision NOT NULL CHECK (heartbeat_interval_s > 0),
    started_at timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    CHECK (cardinality(queues) = cardinality(concurrency))
);
COMMENT ON TABLE pgoutbox.workers IS
    'One row per running worker process (Client with queues), upserted every heartbeat; stale after 3 missed heartbeats, then pruned.';

-- +goose Down
DROP TABLE pgoutbox.workers;
