-- Replay-safe alternative: the lease is the row lock of an open transaction;
-- one UPDATE to completed, one commit.
BEGIN;
SELECT string_agg(id::text, ',') AS ids FROM (
    SELECT id, payload FROM pgoutbox.effects
    WHERE state = 'available' AND queue = 'bench' AND available_at <= now()
    ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) x \gset
UPDATE pgoutbox.effects SET state = 'completed', attempts = attempts + 1, completed_at = now(), leased_at = now()
WHERE id IN (:ids);
COMMIT;
