-- Replay-safe alternative: the lease is the row lock of an open transaction;
-- completion deletes the row (idempotency and history kept elsewhere).
BEGIN;
SELECT string_agg(id::text, ',') AS ids FROM (
    SELECT id, payload FROM pgoutbox.effects
    WHERE state = 'available' AND queue = 'bench' AND available_at <= now()
    ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) x \gset
DELETE FROM pgoutbox.effects WHERE id IN (:ids);
COMMIT;
