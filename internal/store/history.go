package store

import (
	"context"
	"strconv"
)

// effectAuditSQL finds the console actions that named one effect: a target
// "effect ID …" (resolve, supersede) or a list "ids A,B,…" (replay), by
// id, oldest first. console_audit is an operator's log, small and append
// only: a scan.
const effectAuditSQL = `
SELECT id, at, operator, session, action, target, changed, outcome FROM (
    SELECT * FROM pgoutbox.console_audit
    WHERE target ~ ('^effect ' || $1 || '([^0-9]|$)')
       OR target ~ ('ids ([0-9]+,)*' || $1 || '([^0-9]|$)')
    ORDER BY id DESC LIMIT $2
) a ORDER BY id`

// ListEffectAudit returns the newest limit console actions that named the
// effect id, oldest first.
func ListEffectAudit(ctx context.Context, db DBTX, id int64, limit int) ([]AuditEntry, error) {
	return queryAudit(ctx, db, effectAuditSQL, strconv.FormatInt(id, 10), limit)
}
