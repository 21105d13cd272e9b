-- +goose Up
-- Paused queues (docs/console.md, docs/operations.md): while a queue has a
-- row here, no claim takes its effects (both lease modes and the NATS
-- relay: the claim's WHERE reads this table, one primary-key probe per
-- claim statement, not per row). Enqueues go on; the effects wait as
-- available. The row survives restarts; deleting it (resume) lets the
-- queue's workers claim again at their next poll or notification.
-- paused_by is the operator's label (console) or the CLI's --by; reason is
-- free text. Both are bounded.
CREATE TABLE pgoutbox.queue_pauses (
    queue      text PRIMARY KEY CHECK (queue <> '' AND length(queue) <= 128),
    paused_by  text NOT NULL CHECK (length(paused_by) <= 200),
    paused_at  timestamptz NOT NULL DEFAULT now(),
    reason     text NOT NULL DEFAULT '' CHECK (length(reason) <= 500)
);
COMMENT ON TABLE pgoutbox.queue_pauses IS
    'Paused queues: no claim takes their effects while a row exists (docs/console.md).';

-- +goose Down
DROP TABLE pgoutbox.queue_pauses;
