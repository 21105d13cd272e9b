-- 5,000 effects of 300 bytes in one statement, keys as pgoutbox.Key makes
-- them (hex SHA-256). Since migration 00006 the keys live in
-- pgoutbox.effect_keys: a plain INSERT gets its key rows from the effects'
-- statement trigger (a key already taken raises unique_violation; with
-- random bases a collision is vanishingly rare).
\set base random(1, 1000000000)
INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
SELECT 'bench', 'noop', encode(sha256((:base::bigint * 10000 + g)::text::bytea), 'hex'),
       jsonb_build_object('pad', repeat('x', 290))
FROM generate_series(1, 5000) g;
