-- +goose Up
-- Row-lock claims leave a durable record (docs/design.md "Row-lock
-- leases"). A row-lock batch (QueueConfig.RowLockLease) writes nothing to
-- the effects it holds until it closes, so a worker that dies during the
-- hold counts no attempt. Until now the only trace of such a crash was the
-- dead claimer's lock in each row's xmax, which VACUUM (FREEZE), and plain
-- (auto)vacuum with vacuum_freeze_min_age = 0 or PostgreSQL 16's
-- opportunistic freezing, erases: a poison effect that kills its worker
-- was then delivered uncounted forever.
--
-- Now a batch records the ids it locked, one row per batch, committed on
-- its own (asynchronous commit: a worker's crash does not lose it, a
-- server crash may) before any of them is delivered, and deletes the row
-- in the transaction that closes the batch. A row that an available effect
-- shares with an unclosed batch that no longer holds its lock was claimed
-- by a batch that died: the next claim delivers that effect under a
-- durable lease, which counts the attempt. store.PruneLockClaims deletes
-- the records of dead batches whose effects have all moved on.
--
-- Only the engine's owner reads or writes the table: a role without
-- privileges on it cannot forge or erase a record.
CREATE TABLE pgoutbox.lock_claims (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL,
    effect_ids  bigint[] NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON pgoutbox.lock_claims FROM PUBLIC;
COMMENT ON TABLE pgoutbox.lock_claims IS
    'The effects each open row-lock batch holds; a record left by a batch that never closed marks its effects as attempted (docs/design.md "Row-lock leases").';

-- +goose Down
DROP TABLE pgoutbox.lock_claims;
