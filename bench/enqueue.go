package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/benchrun"
	"github.com/pgoutbox/pgoutbox/internal/store"
	"github.com/pgoutbox/pgoutbox/migrations"
)

// The enqueue scenario compares the ways of writing a backlog side by side
// in one database, batch by batch in turn, so that the machine's load
// weighs on each alike: pgoutbox's enqueue statement fed by parameter
// arrays (EnqueueBatch's path below CopyThreshold) and fed by COPY into a
// temporary table (its path from CopyThreshold on), both through
// internal/store with the payload already encoded; the public
// EnqueueBatch (validation and encoding included, COPY when -insert-batch
// is at least CopyThreshold); and River's InsertManyFast (COPY straight
// into river_job, no unique keys). Every transaction writes -insert-batch
// effects of -payload-bytes from one producer connection; -n effects per
// way. The scenario migrates both systems into its database whatever
// -systems names, so run it once:
//
//	go run . -systems pgoutbox -scenarios enqueue -n 50000 -rounds 3
func init() {
	scenarios = append(scenarios, scenario{
		name: "enqueue",
		figures: []figure{
			{"arrays_per_s", "pgoutbox statement, parameter arrays, effects/s", 0},
			{"copy_per_s", "pgoutbox statement, COPY + insert-select, effects/s", 0},
			{"public_per_s", "pgoutbox.EnqueueBatch (validation included), effects/s", 0},
			{"river_per_s", "River InsertManyFast, effects/s", 0},
			{"copy_arrays", "COPY / arrays", 2},
			{"copy_river", "COPY / River", 2},
			{"arrays_river", "arrays / River", 2},
			{"public_river", "EnqueueBatch / River", 2},
			{"copy_batch_per_s", "pgoutbox statement, COPY + insert-select, batch storage queue, effects/s", 0},
			{"public_batch_per_s", "pgoutbox.EnqueueBatch, batch storage queue, effects/s", 0},
			{"copy_batch_river", "COPY, batch storage / River", 2},
			{"public_batch_river", "EnqueueBatch, batch storage / River", 2},
			{"wal_arrays", "WAL bytes/effect, arrays", 0},
			{"wal_copy", "WAL bytes/effect, COPY", 0},
			{"wal_copy_batch", "WAL bytes/effect, COPY, batch storage", 0},
			{"wal_river", "WAL bytes/effect, River", 0},
		},
		run: runEnqueue,
	})
}

// enqueueWay is one way of writing a batch: effects seq..seq+n-1 in one
// transaction.
type enqueueWay struct {
	key   string
	write func(ctx context.Context, seq, n int) error
}

func runEnqueue(ctx context.Context, e *env) (result, error) {
	if err := migrateBoth(ctx, e); err != nil {
		return nil, err
	}
	river := &riverSystem{payloadBytes: e.o.payloadBytes}
	rr, err := river.Prepare(ctx, e.pool, workerConfig{workers: 1}) // never started: inserts only
	if err != nil {
		return nil, err
	}
	args := newArgs(e.o.payloadBytes)
	payload, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	rows := func(way string, seq, n int) []store.NewEffect {
		out := make([]store.NewEffect, n)
		for i := range out {
			out[i] = store.NewEffect{Queue: way, Type: pgType, Key: pgoutbox.Key(way, strconv.Itoa(seq+i)),
				Payload: payload, MaxAttempts: pgoutbox.MaxAttemptsDefault}
		}
		return out
	}
	inTx := func(ctx context.Context, f func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, e.prod, f) }
	ways := []enqueueWay{
		{"arrays_per_s", func(ctx context.Context, seq, n int) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := store.Insert(ctx, tx, rows("arrays", seq, n))
				return err
			})
		}},
		{"copy_per_s", func(ctx context.Context, seq, n int) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := store.InsertCopy(ctx, tx, rows("copy", seq, n))
				return err
			})
		}},
		{"public_per_s", func(ctx context.Context, seq, n int) error {
			effects := make([]pgoutbox.Effect, n)
			for i := range effects {
				effects[i] = pgoutbox.Effect{Queue: "public", Type: pgType, Key: pgoutbox.Key("public", strconv.Itoa(seq+i)), Payload: args}
			}
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := pgoutbox.EnqueueBatch(ctx, tx, effects)
				return err
			})
		}},
		{"river_per_s", func(ctx context.Context, seq, n int) error { return rr.InsertBatch(ctx, e.prod, seq, n) }},
		// The same two paths into queues of batch storage: their rows go to
		// pgoutbox.stream, which has fewer indexes than pgoutbox.effects.
		{"copy_batch_per_s", func(ctx context.Context, seq, n int) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := store.InsertCopy(ctx, tx, rows("copybatch", seq, n))
				return err
			})
		}},
		{"public_batch_per_s", func(ctx context.Context, seq, n int) error {
			effects := make([]pgoutbox.Effect, n)
			for i := range effects {
				effects[i] = pgoutbox.Effect{Queue: "publicbatch", Type: pgType, Key: pgoutbox.Key("publicbatch", strconv.Itoa(seq+i)),
					Payload: args}
			}
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := pgoutbox.EnqueueBatch(ctx, tx, effects)
				return err
			})
		}},
	}
	for _, q := range []string{"copybatch", "publicbatch"} {
		if err := pgoutbox.SetStorage(ctx, e.pool, q, pgoutbox.StorageBatch); err != nil {
			return nil, err
		}
	}
	spent := make([]time.Duration, len(ways))
	wal := make([]float64, len(ways))
	batch := e.o.insertBatch
	for round, seq := 0, 0; seq < e.o.n; round, seq = round+1, seq+batch {
		n := min(batch, e.o.n-seq)
		for j := range ways {
			w := (round + j) % len(ways) // each way goes first in turn
			lsn, err := benchrun.WALLSN(ctx, e.pool)
			if err != nil {
				return nil, err
			}
			t0 := time.Now()
			if err := ways[w].write(ctx, seq, n); err != nil {
				return nil, fmt.Errorf("%s: %w", ways[w].key, err)
			}
			spent[w] += time.Since(t0)
			// Server-wide, so autovacuum's is counted with the way it
			// ran beside.
			b, err := benchrun.WALSince(ctx, e.pool, lsn)
			if err != nil {
				return nil, err
			}
			wal[w] += b
		}
	}
	// The batch storage ways measured the stream only if their rows went
	// there.
	for _, q := range []string{"copybatch", "publicbatch"} {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.stream WHERE queue = $1`, q).Scan(&n); err != nil {
			return nil, err
		}
		if n != e.o.n {
			return nil, fmt.Errorf("queue %s: %d of %d effects in pgoutbox.stream", q, n, e.o.n)
		}
	}
	res := result{}
	for i, w := range ways {
		res[w.key] = float64(e.o.n) / spent[i].Seconds()
	}
	res["wal_arrays"] = wal[0] / float64(e.o.n)
	res["wal_copy"] = wal[1] / float64(e.o.n)
	res["wal_river"] = wal[3] / float64(e.o.n)
	res["wal_copy_batch"] = wal[4] / float64(e.o.n)
	res["copy_batch_river"] = res["copy_batch_per_s"] / res["river_per_s"]
	res["public_batch_river"] = res["public_batch_per_s"] / res["river_per_s"]
	res["copy_arrays"] = res["copy_per_s"] / res["arrays_per_s"]
	res["copy_river"] = res["copy_per_s"] / res["river_per_s"]
	res["arrays_river"] = res["arrays_per_s"] / res["river_per_s"]
	res["public_river"] = res["public_per_s"] / res["river_per_s"]
	return res, nil
}

// migrateBoth installs whichever of pgoutbox's and River's schemas the
// scenario's system did not.
func migrateBoth(ctx context.Context, e *env) error {
	var pg, rv bool
	err := e.pool.QueryRow(ctx, `SELECT to_regclass('pgoutbox.effects') IS NOT NULL, to_regclass('river_job') IS NOT NULL`).Scan(&pg, &rv)
	if err != nil {
		return err
	}
	if !pg {
		if _, err := migrations.Up(ctx, e.dsn); err != nil {
			return fmt.Errorf("pgoutbox migrations: %w", err)
		}
	}
	if !rv {
		if err := (&riverSystem{}).Migrate(ctx, e.dsn); err != nil {
			return fmt.Errorf("river migrations: %w", err)
		}
	}
	return nil
}
