/**
 * A worker that delivers a queue's effects to TypeScript handlers through
 * the database's worker functions (pgoutbox.claim, mark_started, complete,
 * fail, extend, recover_expired: migration 00025, docs/any-language.md,
 * "Workers"). Every rule of the Go engine — fences, attempts, backoff and
 * its cap, dead-lettering, delivery_started_at before a non-replay-safe
 * handler, per-key ordering — is the database's: this module only decides
 * when to call them.
 *
 * Leases are durable (a row-lock lease would be a transaction held open
 * for the whole delivery). The worker's role needs pgoutbox_worker and a
 * grant on the queue (pgoutbox.grant_work).
 */
import { hostname } from "node:os";
import { randomBytes } from "node:crypto";

/** How a failed delivery ends (Go's Outcome). */
export type Outcome = "retry" | "retry_after" | "permanent" | "ambiguous";

/**
 * A handler's classification of its failure; build it with {@link retry},
 * {@link retryAfter}, {@link permanent} or {@link ambiguous}. Any other
 * error is a retry for a replay-safe type and ambiguous for the others
 * (Go's classify).
 */
export class OutcomeError extends Error {
  /** The classification. */
  readonly outcome: Outcome;
  /** The delay asked for with retryAfter, in milliseconds; 0 for the others. */
  readonly afterMs: number;

  constructor(outcome: Outcome, cause: unknown, afterMs = 0) {
    const msg = cause instanceof Error ? cause.message : String(cause);
    super(outcome === "retry_after" ? `${msg} (retry after ${afterMs}ms)` : `${msg} (${outcome})`, { cause });
    this.name = "OutcomeError";
    this.outcome = outcome;
    this.afterMs = afterMs;
  }
}

/** A transient failure with nothing delivered: retried with backoff until max attempts, then dead-lettered. */
export function retry(cause: unknown): OutcomeError {
  return new OutcomeError("retry", cause);
}

/** retry, no earlier than ms from now (or later when the backoff is longer); cut to 1 hour or the backoff cap. */
export function retryAfter(ms: number, cause: unknown): OutcomeError {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
    throw new TypeError(`pgoutbox: retryAfter needs a finite, non-negative number of milliseconds, not ${String(ms)}`);
  }
  return new OutcomeError("retry_after", cause, Math.min(ms, 86_400_000));
}

/** A permanent failure: dead-lettered now, whatever attempts remain. */
export function permanent(cause: unknown): OutcomeError {
  return new OutcomeError("permanent", cause);
}

/**
 * The request may have been processed (a timeout after sending): retried
 * for a replay-safe type; reconciliation_required for the others.
 */
export function ambiguous(cause: unknown): OutcomeError {
  return new OutcomeError("ambiguous", cause);
}

/** An effect handed to a handler. */
export interface Delivery {
  /** The effect's id (a decimal string: PostgreSQL bigint). */
  id: string;
  queue: string;
  type: string;
  /** The idempotency key. */
  key: string;
  /** The payload, parsed. */
  payload: unknown;
  /** This attempt's number, from 1. */
  attempt: number;
  maxAttempts: number;
  createdAt: Date;
  /** The ordering key, or null. */
  orderingKey: string | null;
  /** Aborted when the lease is lost (another worker may have the effect) or the worker stops without waiting. */
  signal: AbortSignal;
}

/** One effect type's handler and properties (Go's EffectType). */
export interface EffectType {
  /** Delivers the effect; resolves on success, throws (ideally an {@link OutcomeError}) on failure. */
  handler: (d: Delivery) => Promise<void>;
  /**
   * Replay-safe types may be delivered more than once (at-least-once).
   * Default false: the worker commits delivery_started_at before the
   * handler runs, and a delivery whose outcome is unknown (an ambiguous
   * failure, a worker killed mid-delivery) goes to reconciliation_required,
   * never delivered twice.
   */
  replaySafe?: boolean;
}

/** What the worker runs on: a node-postgres Pool, or anything with its query and connect. */
export interface WorkerPool {
  query(text: string, values?: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
  connect(): Promise<ListenClient>;
}

/** A pooled connection that can LISTEN (node-postgres' PoolClient). */
export interface ListenClient {
  query(text: string, values?: unknown[]): Promise<unknown>;
  on(event: "notification", fn: (n: { channel: string; payload?: string }) => void): unknown;
  on(event: "error", fn: (err: Error) => void): unknown;
  removeAllListeners(event?: string): unknown;
  release(err?: Error | boolean): void;
}

/** Worker settings; every duration is in milliseconds. */
export interface WorkerOptions {
  /** The queue to work; the role needs pgoutbox.grant_work on it. */
  queue: string;
  /** Handlers by effect type. A claimed effect of another type is retried (Go's rule for an unregistered type). */
  types: Record<string, EffectType>;
  /** Deliveries at once. Default 10. */
  concurrency?: number;
  /** The lease each claim takes, extended while the handler runs. Default 30,000 (1,000 to 86,400,000). */
  leaseMs?: number;
  /** How often in-flight leases are extended. Default leaseMs / 3. */
  extendEveryMs?: number;
  /** The poll fallback: a claim at least this often without a notification. Default 1,000. */
  pollMs?: number;
  /** How often expired leases of the queue are recovered (pgoutbox.recover_expired). Default 5,000; 0 turns it off (a Go Client's sweeper does it). */
  recoverEveryMs?: number;
  /** The retry backoff's cap (Go's Config.BackoffCap). Default 300,000 (1,000 to 86,400,000). */
  backoffCapMs?: number;
  /** Names this worker in lease_owner (1-128 bytes). Default "<hostname>-<pid>-<random>". */
  workerId?: string;
  /** Told of errors the worker survives (a failed claim, a lost connection); default console.error. */
  onError?: (err: unknown) => void;
  /**
   * Deliver a batch queue's replay-safe types from its batch
   * (pgoutbox.claim_batch and settle_batch): nothing is written per effect
   * delivered. Default true. A row storage queue then costs one more call
   * per claim round (claim_batch returns nothing for it); set false to
   * save it.
   */
  batch?: boolean;
}

/** The channel the engine notifies when a transaction enqueued into a queue (the payload is the queue). */
export const NOTIFY_CHANNEL = "pgoutbox_effects";

/** A batch page in delivery: each effect's outcome, settled together (pgoutbox.settle_batch). */
interface Page {
  batchId: string;
  token: string;
  through: string;
  abort: AbortController;
  /** Effects whose handler has not returned. */
  running: Set<string>;
  delivered: string[];
  failed: Array<{ id: string; outcome: Outcome | "release"; error: string; after: string | null }>;
  done: Promise<void>;
  /** Set once the page is settled, or its lease was lost: its outcomes are no longer written. */
  over: boolean;
}

interface InFlight {
  id: string;
  token: string;
  type: string;
  abort: AbortController;
  done: Promise<void>;
}

/**
 * Delivers one queue's effects to handlers, {@link WorkerOptions.concurrency}
 * at a time: it claims when woken by a notification or by its poll timer,
 * marks a non-replay-safe delivery started before its handler runs,
 * extends the leases of running handlers, records each outcome, and
 * recovers the queue's expired leases. stop() stops claiming, waits for
 * running handlers and gives back what it cannot wait for.
 */
export class Worker {
  readonly id: string;
  private readonly pool: WorkerPool;
  private readonly queue: string;
  private readonly types: Record<string, EffectType>;
  private readonly concurrency: number;
  private readonly leaseMs: number;
  private readonly extendEveryMs: number;
  private readonly pollMs: number;
  private readonly recoverEveryMs: number;
  private readonly backoffCapMs: number;
  private readonly onError: (err: unknown) => void;
  private readonly inFlight = new Map<string, InFlight>();
  private readonly batchTypes: string[];
  private page: Page | undefined;
  private running = false;
  private loop: Promise<void> | undefined;
  private wake: (() => void) | undefined;
  private woken = false;
  private listener: ListenClient | undefined;
  private timers: NodeJS.Timeout[] = [];

  constructor(pool: WorkerPool, opts: WorkerOptions) {
    if (pool === null || typeof pool !== "object" || typeof pool.query !== "function" || typeof pool.connect !== "function") {
      throw new TypeError("pgoutbox: Worker needs a node-postgres Pool");
    }
    this.pool = pool;
    this.queue = opts.queue;
    this.types = { ...opts.types };
    this.concurrency = bounded("concurrency", opts.concurrency ?? 10, 1, 1000);
    this.leaseMs = bounded("leaseMs", opts.leaseMs ?? 30_000, 1000, 86_400_000);
    this.extendEveryMs = bounded("extendEveryMs", opts.extendEveryMs ?? Math.floor(this.leaseMs / 3), 100, this.leaseMs - 1);
    this.pollMs = bounded("pollMs", opts.pollMs ?? 1000, 10, 3_600_000);
    this.recoverEveryMs = opts.recoverEveryMs === 0 ? 0 : bounded("recoverEveryMs", opts.recoverEveryMs ?? 5000, 100, 3_600_000);
    this.backoffCapMs = bounded("backoffCapMs", opts.backoffCapMs ?? 300_000, 1000, 86_400_000);
    this.id = opts.workerId ?? `${hostname()}-${process.pid}-${randomBytes(4).toString("hex")}`;
    this.onError = opts.onError ?? ((err) => console.error("pgoutbox worker:", err));
    for (const [name, t] of Object.entries(this.types)) {
      if (typeof t?.handler !== "function") throw new TypeError(`pgoutbox: effect type ${name} has no handler`);
    }
    this.batchTypes =
      opts.batch === false ? [] : Object.entries(this.types).filter(([, t]) => t.replaySafe === true).map(([n]) => n);
  }

  /** Starts listening and claiming. The first claim runs before start resolves. */
  async start(): Promise<void> {
    if (this.running) throw new Error("pgoutbox: Worker already started");
    this.running = true;
    await this.listen();
    this.timers.push(setInterval(() => this.signal(), this.pollMs));
    this.timers.push(setInterval(() => void this.extend(), this.extendEveryMs));
    if (this.recoverEveryMs > 0) {
      this.timers.push(setInterval(() => void this.recover(), this.recoverEveryMs));
    }
    this.loop = this.claimLoop();
  }

  /**
   * Stops claiming, waits up to timeoutMs (default the lease) for running
   * handlers, then aborts the ones still running and gives their effects
   * back (routed like every recovery: a started non-replay-safe effect to
   * reconciliation_required, the others to available).
   */
  async stop(timeoutMs = this.leaseMs): Promise<void> {
    if (!this.running) return;
    this.running = false;
    this.signal();
    await this.loop;
    const pending = Promise.all([...[...this.inFlight.values()].map((f) => f.done), this.page?.done]);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = await Promise.race([
      pending.then(() => false),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(true), timeoutMs);
      }),
    ]);
    clearTimeout(timer);
    if (timedOut) {
      // The page's unfinished effects go back unrun (outcome release).
      if (this.page) await this.settlePage(this.page, true);
      for (const f of [...this.inFlight.values()]) {
        this.inFlight.delete(f.id);
        f.abort.abort(new Error("pgoutbox: worker stopped"));
        await this.call("release", () =>
          this.pool.query(
            "SELECT pgoutbox.fail($1::bigint, $2::uuid, $3, 'release', 'worker stopped', true) AS state",
            [f.id, f.token, f.type],
          ),
        );
      }
    }
    for (const t of this.timers) clearInterval(t);
    this.timers = [];
    const l = this.listener;
    this.listener = undefined;
    if (l) {
      l.removeAllListeners("notification");
      try {
        await l.query(`UNLISTEN ${NOTIFY_CHANNEL}`);
        l.release();
      } catch (err) {
        l.release(err instanceof Error ? err : true);
      }
    }
  }

  private signal(): void {
    this.woken = true;
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  private async listen(): Promise<void> {
    if (this.listener || !this.running) return;
    try {
      const c = await this.pool.connect();
      c.on("notification", (n) => {
        if (n.channel === NOTIFY_CHANNEL && n.payload === this.queue) this.signal();
      });
      c.on("error", (err) => {
        // The poll timer keeps claiming; the next claim round listens again.
        this.onError(err);
        if (this.listener === c) this.listener = undefined;
        c.removeAllListeners("notification");
        c.release(err);
      });
      await c.query(`LISTEN ${NOTIFY_CHANNEL}`);
      this.listener = c;
    } catch (err) {
      this.onError(err);
    }
  }

  private async claimLoop(): Promise<void> {
    while (this.running) {
      this.woken = false;
      let free = this.concurrency - this.inFlight.size - (this.page?.running.size ?? 0);
      const want = free;
      let claimed = 0;
      if (free > 0 && this.batchTypes.length > 0 && this.page === undefined) {
        if (!this.listener) await this.listen();
        // A slot stays for the row claim (retries, other types), which
        // full pages would otherwise starve while the stream has a backlog.
        const pageMax = free > 1 ? free - 1 : free;
        const rows = await this.call("claim batch", async () => {
          const r = await this.pool.query(
            "SELECT batch_id::text AS batch_id, batch_token::text AS batch_token, through::text AS through, id::text AS id, effect_type, idempotency_key, payload, attempt, max_attempts, created_at, ordering_key FROM pgoutbox.claim_batch($1, $2, $3::text[], $4, $5::interval)",
            [this.queue, this.id, this.batchTypes, pageMax, `${this.leaseMs} milliseconds`],
          );
          return r.rows;
        });
        if (rows && rows.length > 0) {
          this.deliverPage(rows);
          claimed = rows.length;
          free -= rows.length;
        }
      }
      if (free > 0) {
        if (!this.listener) await this.listen();
        const rows = await this.call("claim", async () => {
          const r = await this.pool.query(
            "SELECT id::text AS id, effect_type, idempotency_key, payload, attempt, max_attempts, lease_token::text AS lease_token, created_at, ordering_key FROM pgoutbox.claim($1, $2, $3, $4::interval, $5)",
            // A worker that delivers the batches claims rows only: pgoutbox.claim
            // would otherwise move the stream's unleased pages into rows.
            [this.queue, this.id, free, `${this.leaseMs} milliseconds`, this.batchTypes.length === 0],
          );
          return r.rows;
        });
        for (const row of rows ?? []) this.deliver(row);
        claimed += rows?.length ?? 0;
      }
      // A full claim may have left more; otherwise wait for a notification,
      // a finished delivery or the poll timer.
      if (this.running && (claimed === 0 || claimed < want) && !this.woken) {
        await new Promise<void>((resolve) => {
          this.wake = resolve;
        });
      }
    }
  }

  private delivery(row: Record<string, unknown>, signal: AbortSignal): Delivery {
    return {
      id: String(row.id),
      queue: this.queue,
      type: String(row.effect_type),
      key: String(row.idempotency_key),
      payload: row.payload,
      attempt: Number(row.attempt),
      maxAttempts: Number(row.max_attempts),
      createdAt: row.created_at as Date,
      orderingKey: row.ordering_key == null ? null : String(row.ordering_key),
      signal,
    };
  }

  private deliver(row: Record<string, unknown>): void {
    const abort = new AbortController();
    const d = this.delivery(row, abort.signal);
    const token = String(row.lease_token);
    const f: InFlight = { id: d.id, token, type: d.type, abort, done: Promise.resolve() };
    this.inFlight.set(d.id, f);
    f.done = this.run(d, token).catch((err: unknown) => this.onError(err)).finally(() => {
      if (this.inFlight.get(d.id) === f) this.inFlight.delete(d.id);
      this.signal();
    });
  }

  /**
   * Delivers a page of a batch (the rows of one claim_batch): its handlers
   * run at once, each outcome is kept, and the page is settled in one call
   * when the last returns.
   */
  private deliverPage(rows: Array<Record<string, unknown>>): void {
    const first = rows[0];
    const page: Page = {
      batchId: String(first.batch_id),
      token: String(first.batch_token),
      through: String(first.through),
      abort: new AbortController(),
      running: new Set(rows.map((r) => String(r.id))),
      delivered: [],
      failed: [],
      done: Promise.resolve(),
      over: false,
    };
    this.page = page;
    const runs = rows.map(async (row) => {
      const d = this.delivery(row, page.abort.signal);
      try {
        await this.types[d.type].handler(d);
        if (!page.over) page.delivered.push(d.id);
      } catch (err) {
        if (!page.over) page.failed.push({ id: d.id, ...classify(err ?? new Error("handler threw a nullish value"), true) });
      } finally {
        page.running.delete(d.id);
      }
    });
    page.done = Promise.all(runs)
      .then(() => this.settlePage(page, false))
      .catch((err: unknown) => this.onError(err))
      .finally(() => {
        if (this.page === page) this.page = undefined;
        this.signal();
      });
  }

  /**
   * Settles page: its delivered and failed effects, and (release) its
   * unfinished ones given back unrun. Nothing is written once the page is
   * over (settled, or its lease lost).
   */
  private async settlePage(page: Page, release: boolean): Promise<void> {
    if (page.over) return;
    page.over = true;
    const failed = [...page.failed];
    if (release) {
      for (const id of page.running) failed.push({ id, outcome: "release", error: "worker stopped", after: null });
      page.abort.abort(new Error("pgoutbox: worker stopped"));
    }
    await this.call("settle batch", () =>
      this.pool.query(
        "SELECT pgoutbox.settle_batch($1, $2::bigint, $3::uuid, $4::bigint, $5, $6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::interval[], $11::interval) AS ok",
        [
          this.queue,
          page.batchId,
          page.token,
          page.through,
          this.id,
          page.delivered,
          failed.map((f) => f.id),
          failed.map((f) => f.outcome),
          failed.map((f) => f.error),
          failed.map((f) => f.after),
          `${this.backoffCapMs} milliseconds`,
        ],
      ),
    );
  }

  private async run(d: Delivery, token: string): Promise<void> {
    const t = this.types[d.type];
    const replaySafe = t === undefined ? true : t.replaySafe === true;
    const fence = [d.id, token, d.type];
    let herr: unknown;
    if (t === undefined) {
      herr = retry(new Error(`no handler registered for effect type "${d.type}"`));
    } else {
      if (!replaySafe) {
        // Committed before the handler runs: from now on an unknown outcome
        // is reconciliation_required, never a second delivery.
        const r = await this.call("mark started", () =>
          this.pool.query("SELECT pgoutbox.mark_started($1::bigint, $2::uuid, $3) AS ok", fence),
        );
        if (r?.rows[0]?.ok !== true) return; // the lease was lost (or the call failed): deliver nothing
      }
      try {
        await t.handler(d);
        herr = undefined;
      } catch (err) {
        herr = err ?? new Error("handler threw a nullish value");
      }
    }
    if (d.signal.aborted) return; // lost or given back: the outcome is no longer ours to write
    if (herr === undefined) {
      await this.call("complete", () => this.pool.query("SELECT pgoutbox.complete($1::bigint, $2::uuid, $3) AS ok", fence));
      return;
    }
    const { outcome, after, error } = classify(herr, replaySafe);
    await this.call("fail", () =>
      this.pool.query(
        "SELECT pgoutbox.fail($1::bigint, $2::uuid, $3, $4, $5, $6, $7::interval, $8::interval) AS state",
        [...fence, outcome, error, replaySafe, after, `${this.backoffCapMs} milliseconds`],
      ),
    );
  }

  private async extend(): Promise<void> {
    const page = this.page;
    if (page && !page.over) {
      const r = await this.call("extend batch", () =>
        this.pool.query("SELECT pgoutbox.extend_batch($1, $2::bigint, $3::uuid, $4::interval) AS ok", [
          this.queue,
          page.batchId,
          page.token,
          `${this.leaseMs} milliseconds`,
        ]),
      );
      if (r && r.rows[0]?.ok !== true && !page.over) {
        // Another worker took the batch over: its outcomes are not ours.
        page.over = true;
        page.abort.abort(new Error("pgoutbox: lease lost"));
      }
    }
    const fs = [...this.inFlight.values()];
    if (fs.length === 0) return;
    const r = await this.call("extend", () =>
      this.pool.query(
        "SELECT id::text AS id, lease_token::text AS lease_token FROM pgoutbox.extend($1::bigint[], $2::uuid[], $3::text[], $4::interval)",
        [fs.map((f) => f.id), fs.map((f) => f.token), fs.map((f) => f.type), `${this.leaseMs} milliseconds`],
      ),
    );
    if (!r) return;
    const held = new Set(r.rows.map((x) => `${String(x.id)}/${String(x.lease_token)}`));
    for (const f of fs) {
      if (!held.has(`${f.id}/${f.token}`) && this.inFlight.get(f.id) === f) {
        this.inFlight.delete(f.id);
        f.abort.abort(new Error("pgoutbox: lease lost"));
      }
    }
  }

  private async recover(): Promise<void> {
    await this.call("recover", () => this.pool.query("SELECT id FROM pgoutbox.recover_expired($1)", [this.queue]));
  }

  // call runs one statement, reporting (not throwing) its error.
  private async call<T>(what: string, fn: () => Promise<T>): Promise<T | undefined> {
    try {
      return await fn();
    } catch (err) {
      this.onError(Object.assign(new Error(`pgoutbox: ${what}: ${err instanceof Error ? err.message : String(err)}`), { cause: err }));
      return undefined;
    }
  }
}

/**
 * The outcome, retry_after interval and recorded error text of a handler's
 * failure herr (Go's classify): an {@link OutcomeError}'s own outcome, any
 * other error a retry for a replay-safe type and ambiguous for the others.
 */
function classify(herr: unknown, replaySafe: boolean): { outcome: Outcome; after: string | null; error: string } {
  let outcome: Outcome = replaySafe ? "retry" : "ambiguous";
  let after: string | null = null;
  if (herr instanceof OutcomeError) {
    outcome = herr.outcome;
    if (outcome === "retry_after") after = `${herr.afterMs} milliseconds`;
  }
  return { outcome, after, error: (herr instanceof Error ? herr.message : String(herr)).slice(0, 2000) };
}

function bounded(name: string, v: number, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new RangeError(`pgoutbox: ${name} must be an integer from ${min} to ${max}, not ${String(v)}`);
  }
  return v;
}
