-- Today's lifecycle (internal/store): claim a batch of 100 (UPDATE to leased,
-- durable lease), then complete it in a second transaction (UPDATE to
-- completed). :client_id stands in for the lease owner.
WITH next AS (
    SELECT id FROM pgoutbox.effects
    WHERE state = 'available' AND queue = 'bench' AND available_at <= now()
    ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE pgoutbox.effects e
SET state = 'leased', attempts = e.attempts + 1, lease_owner = 'c' || :client_id,
    lease_token = gen_random_uuid(), leased_at = now(), lease_expires_at = now() + make_interval(secs => 60)
FROM next WHERE e.id = next.id
RETURNING e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.attempts, e.max_attempts, e.lease_token, e.created_at;
UPDATE pgoutbox.effects e
SET state = 'completed', completed_at = now(), lease_token = NULL, lease_expires_at = NULL, last_error = NULL
WHERE e.state = 'leased' AND e.lease_owner = 'c' || :client_id;
