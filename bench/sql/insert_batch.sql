-- 5,000 effects of 300 bytes in one statement, keys as pgoutbox.Key makes
-- them (hex SHA-256), with the engine's ON CONFLICT.
\set base random(1, 1000000000)
INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
SELECT 'bench', 'noop', encode(sha256((:base::bigint * 10000 + g)::text::bytea), 'hex'),
       jsonb_build_object('pad', repeat('x', 290))
FROM generate_series(1, 5000) g
ON CONFLICT (queue, idempotency_key) DO NOTHING;
