-- One effect per transaction, as an application enqueues (the insert trigger
-- NOTIFYs at commit).
INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
VALUES ('bench', 'noop', md5(random()::text) || md5(random()::text), jsonb_build_object('pad', repeat('x', 290)));
