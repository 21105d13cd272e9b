-- +goose Up
-- A webhook body is accepted once (docs/controlplane.md, "What a signature
-- does and does not prove"). X-Hub-Signature-256 covers the body only, so a
-- captured delivery posted again under a new X-GitHub-Delivery (or another
-- X-GitHub-Event) verifies; GitHub's own redelivery repeats both the
-- delivery id and the body. From this version the body's SHA-256 is unique
-- among the rows that replay_of leaves NULL, which is every row written
-- from now on: the ingest's INSERT ... ON CONFLICT DO NOTHING writes
-- nothing for a known body.
--
-- Rows written before, under another delivery id with the body of an
-- earlier row (replays the old ingest accepted), keep their content and
-- are marked: replay_of is the id of the earliest row with that body.
ALTER TABLE control_plane.webhook_inbox
    ADD COLUMN replay_of bigint REFERENCES control_plane.webhook_inbox (id);

UPDATE control_plane.webhook_inbox i
SET replay_of = f.first_id
FROM (
    SELECT body_sha256, min(id) AS first_id
    FROM control_plane.webhook_inbox
    GROUP BY body_sha256
    HAVING count(*) > 1
) f
WHERE i.body_sha256 = f.body_sha256 AND i.id <> f.first_id;

CREATE UNIQUE INDEX webhook_inbox_body_sha256_key
    ON control_plane.webhook_inbox (body_sha256) WHERE replay_of IS NULL;

-- +goose Down
DROP INDEX control_plane.webhook_inbox_body_sha256_key;
ALTER TABLE control_plane.webhook_inbox DROP COLUMN replay_of;
