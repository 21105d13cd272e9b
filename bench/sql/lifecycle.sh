#!/usr/bin/env bash
# Raw-SQL cost of an effect's lifecycle on pgoutbox's schema, variant by
# variant (docs/benchmarks.md, "What limits pgoutbox"): PostgreSQL backend CPU
# per effect (from /proc, so the server must run on this machine and be
# readable), WAL bytes per effect and rows/s, one pgbench client.
#
#   bench/sql/lifecycle.sh            # DATABASE_URL or the local server
#   REPS=3 bench/sql/lifecycle.sh
#
# It creates the database pgoutbox_bench_sql (dropped at the end).
set -euo pipefail
cd "$(dirname "$0")"
ADMIN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
REPS=${REPS:-2}
DBNAME=pgoutbox_bench_sql
DSN=$(cd .. && go run . -dsn "$ADMIN" -create-db "$DBNAME")
trap 'psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DBNAME WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

DATADIR=$(psql "$DSN" -Atc "SELECT current_setting('data_directory')")
POSTMASTER=$(head -1 "$DATADIR/postmaster.pid" 2>/dev/null || echo 0)

# cpu_ticks: utime+stime (1/100 s) of the server processes connected to DBNAME.
cpu_ticks() {
	local t=0 p line rest
	for p in /proc/[0-9]*; do
		{ read -r line <"$p/stat"; } 2>/dev/null || continue
		rest=${line##*) }
		set -- $rest
		[ "$2" = "$POSTMASTER" ] || continue
		{ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q " $DBNAME " || continue
		t=$((t + ${12} + ${13}))
	done
	echo "$t"
}

# reset SQL...: empty table, apply the variant, 100,000 available effects.
reset() {
	psql "$DSN" -q >/dev/null 2>&1 <<EOF
TRUNCATE pgoutbox.effects;
ALTER TABLE pgoutbox.effects DROP CONSTRAINT IF EXISTS effects_queue_key;
ALTER TABLE pgoutbox.effects ADD CONSTRAINT effects_queue_key UNIQUE (queue, idempotency_key);
ALTER TABLE pgoutbox.effects ENABLE TRIGGER effects_notify_insert;
$1
INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
SELECT 'bench', 'noop', encode(sha256(g::text::bytea), 'hex'), jsonb_build_object('pad', repeat('x', 290))
FROM generate_series(1, ${2:-100000}) g;
VACUUM ANALYZE pgoutbox.effects;
CHECKPOINT;
EOF
}

# measure LABEL SCRIPT TRANSACTIONS ROWS_PER_TRANSACTION [CLIENTS]
measure() {
	local lsn pid max=0 v rows wal tps
	lsn=$(psql "$DSN" -Atc "SELECT pg_current_wal_lsn()")
	pgbench -n -c "${5:-1}" -j "${5:-1}" -t "$3" -f "$2" "$DSN" >/tmp/pgoutbox-lifecycle.out 2>&1 &
	pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		v=$(cpu_ticks)
		[ "$v" -gt "$max" ] && max=$v
		sleep 0.1
	done
	wait "$pid" || { cat /tmp/pgoutbox-lifecycle.out; return 1; }
	rows=$(($3 * $4 * ${5:-1}))
	wal=$(psql "$DSN" -Atc "SELECT round(pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn') / $rows)")
	tps=$(awk '/^tps/ {print $3}' /tmp/pgoutbox-lifecycle.out)
	[ "$rows" -ge 50000 ] || wal="-" # too few rows: other traffic on the server dominates
	printf '| %-58s | %10.1f | %9s | %9.0f |\n' "$1" "$(echo "$max * 10000 / $rows" | bc -l)" "$wal" "$(echo "$tps * $4" | bc -l)"
}

echo "| variant (1 client, batches of 100 unless said) | backend CPU µs/effect | WAL B/effect | effects/s |"
echo "|---|---:|---:|---:|"
for _ in $(seq "$REPS"); do
	reset ""
	measure "claim UPDATE + complete UPDATE (today)" claim_complete_today.sql 800 100
	reset "ALTER TABLE pgoutbox.effects DROP CONSTRAINT effects_queue_key;"
	measure "same without the (queue, idempotency_key) unique index" claim_complete_today.sql 800 100
	reset ""
	measure "row lock as lease + one UPDATE, one transaction" rowlock_update.sql 800 100
	reset ""
	measure "row lock as lease + DELETE, one transaction" rowlock_delete.sql 800 100
	reset "" 0
	measure "insert 5,000 per statement (key rows by the statement trigger)" insert_batch.sql 20 5000
	reset "ALTER TABLE pgoutbox.effects DROP CONSTRAINT effects_queue_key;" 0
	measure "insert 5,000 per statement, no unique index" insert_batch_nounique.sql 20 5000
	reset "" 0
	measure "insert 1 per transaction, 16 clients (NOTIFY trigger on)" insert_one.sql 300 1 16
	reset "ALTER TABLE pgoutbox.effects DISABLE TRIGGER effects_notify_insert;" 0
	measure "insert 1 per transaction, 16 clients (NOTIFY trigger off)" insert_one.sql 300 1 16
done
