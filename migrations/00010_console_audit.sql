-- +goose Up
-- The operator console's audit (docs/console.md): one row per action an
-- operator took in the browser (dead-letter replay, reconciliation resolve
-- or supersede), refused or done: who (the operator's label and a digest of
-- the session, never the session id itself), when (database clock), what
-- (the action and its target) and how many effects it changed. Rows are
-- only ever inserted; the console lists them newest first.
CREATE TABLE pgoutbox.console_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    operator    text NOT NULL CHECK (length(operator) <= 200),
    session     text NOT NULL CHECK (length(session) <= 64),
    action      text NOT NULL CHECK (action <> '' AND length(action) <= 64),
    target      text NOT NULL DEFAULT '' CHECK (length(target) <= 1000),
    changed     integer NOT NULL DEFAULT 0 CHECK (changed >= 0),
    outcome     text NOT NULL DEFAULT '' CHECK (length(outcome) <= 2000)
);

-- +goose Down
DROP TABLE pgoutbox.console_audit;
