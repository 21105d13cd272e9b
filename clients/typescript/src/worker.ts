/**
 * A worker that delivers a queue's effects to TypeScript handlers through
 * the database's worker functions (pgoutbox.claim, mark_started, complete,
 * fail, extend, recover_expired: migration 00025; on a batch queue
 * claim_batch, settle_page, extend_batch: migrations 00032-00033;
 * docs/any-language.md, "Workers"). Every rule of the Go engine — fences,
 * attempts, backoff and its cap, dead-lettering, delivery_started_at
 * before a non-replay-safe handler, per-key ordering — is the database's:
 * this module only decides when to call them.
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
  /** node-postgres' (EventEmitter's); when present, the Worker takes its error listener off a connection it gives back. */
  removeListener?(event: "error", fn: (err: Error) => void): unknown;
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
   * (pgoutbox.claim_batch and settle_page): nothing is written per effect
   * delivered. Default true. A row storage queue then costs one more call
   * per claim round (claim_batch returns nothing for it); set false to
   * save it.
   */
  batch?: boolean;
  /**
   * The most effects a batch page holds (claim_batch's max_effects).
   * Default 1,000 (1 to 1,000). The Worker claims smaller pages while its
   * handlers are slow: each page is sized to finish in half of pageHoldMs
   * at the pace of the handlers' recent calls, and at least as many as it
   * runs at once (concurrency - 1, one slot staying for the row claim).
   */
  pageSize?: number;
  /**
   * How long a batch page waits for its slowest handlers (Go's PageHold):
   * the ones still running then are promoted to leases of their own in
   * pgoutbox.effects and finished there, the ones not started move unrun
   * to the row storage, and the page settles (pgoutbox.settle_page), so a
   * slow handler holds the batch's lane for pageHoldMs at most. Default
   * 1,000, or half of leaseMs when that is shorter (10 to 86,400,000).
   */
  pageHoldMs?: number;
}

/** The channel the engine notifies when a transaction enqueued into a queue (the payload is the queue). */
export const NOTIFY_CHANNEL = "pgoutbox_effects";

/** One effect of a batch page. */
interface PageRun {
  d: Delivery;
  abort: AbortController;
  state: "waiting" | "running" | "done";
  /** The handler's error once done; undefined: delivered. */
  err: unknown;
  /** Resolves with the handler's error (undefined: success) when it returns. */
  ended: Promise<unknown>;
}

/** A batch page in delivery: its effects run through the page's slots and settle together (pgoutbox.settle_page). */
interface Page {
  batchId: string;
  token: string;
  through: string;
  runs: PageRun[];
  /** The index of the next run to start. */
  next: number;
  /** Runs started and not returned. */
  active: number;
  /** Runs returned. */
  ended: number;
  /** Set at the cut (every run returned, pageHoldMs passed, or stop): no run starts any more. */
  cut: boolean;
  /** Cuts the page now. */
  cutNow: () => void;
  /** Resolves once the page is settled and its promoted runs handed to the row leases. */
  done: Promise<void>;
  /** Set once the page's lease was lost: its outcomes are no longer written. */
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
  private readonly pageSize: number;
  private readonly pageHoldMs: number;
  /** The page's slots: handlers of a page at once. */
  private readonly pageSlots: number;
  /** The recent mean of a page handler's call, in milliseconds (undefined: none measured yet). */
  private handlerMs: number | undefined;
  private readonly onError: (err: unknown) => void;
  private readonly inFlight = new Map<string, InFlight>();
  private readonly batchTypes: string[];
  private page: Page | undefined;
  private running = false;
  private loop: Promise<void> | undefined;
  private wake: (() => void) | undefined;
  private woken = false;
  /**
   * Set while the Worker listens: ends the LISTEN and gives its
   * connection back to the pool.
   */
  private unlisten: (() => Promise<void>) | undefined;
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
    this.pageSize = bounded("pageSize", opts.pageSize ?? 1000, 1, 1000);
    this.pageHoldMs = bounded("pageHoldMs", opts.pageHoldMs ?? Math.min(1000, Math.floor(this.leaseMs / 2)), 10, 86_400_000);
    this.pageSlots = Math.max(1, this.concurrency - 1);
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
    // A page is cut at once: what did not start goes back unrun, what runs
    // is promoted to a row lease, waited for below like every delivery.
    const page = this.page;
    if (page) {
      page.cutNow();
      await page.done;
    }
    const pending = Promise.all([...this.inFlight.values()].map((f) => f.done));
    let timer: NodeJS.Timeout | undefined;
    const timedOut = await Promise.race([
      pending.then(() => false),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(true), timeoutMs);
      }),
    ]);
    clearTimeout(timer);
    if (timedOut) {
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
    const unlisten = this.unlisten;
    this.unlisten = undefined;
    await unlisten?.();
  }

  private signal(): void {
    this.woken = true;
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  private async listen(): Promise<void> {
    if (this.unlisten || !this.running) return;
    let c: ListenClient;
    try {
      c = await this.pool.connect();
    } catch (err) {
      this.onError(err);
      return;
    }
    let released = false;
    const release = (err?: Error | boolean): void => {
      if (released) return;
      released = true;
      c.removeAllListeners("notification");
      c.release(err);
    };
    c.on("notification", (n) => {
      if (n.channel === NOTIFY_CHANNEL && n.payload === this.queue) this.signal();
    });
    let unlisten: (() => Promise<void>) | undefined;
    const onError = (err: Error): void => {
      // The poll timer keeps claiming; the next claim round listens again.
      // The connection is destroyed: this listener stays on it.
      this.onError(err);
      if (unlisten && this.unlisten === unlisten) this.unlisten = undefined;
      release(err);
    };
    c.on("error", onError);
    try {
      await c.query(`LISTEN ${NOTIFY_CHANNEL}`);
    } catch (err) {
      // A failed LISTEN gives its connection back too.
      this.onError(err);
      release(err instanceof Error ? err : true);
      return;
    }
    if (released) return;
    unlisten = async () => {
      try {
        await c.query(`UNLISTEN ${NOTIFY_CHANNEL}`);
      } catch (err) {
        release(err instanceof Error ? err : true);
        return;
      }
      // Back to the pool, which watches its idle connections itself: one
      // listener of this Worker more on each connection it took would pile
      // up over Workers sharing the pool.
      c.removeListener?.("error", onError);
      release();
    };
    this.unlisten = unlisten;
  }

  private async claimLoop(): Promise<void> {
    while (this.running) {
      this.woken = false;
      // A page holds its slots until it settles.
      let free = this.concurrency - this.inFlight.size - (this.page ? this.pageSlots : 0);
      const want = free;
      let claimed = 0;
      if (free > 0 && this.batchTypes.length > 0 && this.page === undefined) {
        if (!this.unlisten) await this.listen();
        const rows = await this.call("claim batch", async () => {
          const r = await this.pool.query(
            "SELECT batch_id::text AS batch_id, batch_token::text AS batch_token, through::text AS through, id::text AS id, effect_type, idempotency_key, payload, attempt, max_attempts, created_at, ordering_key FROM pgoutbox.claim_batch($1, $2, $3::text[], $4, $5::interval)",
            [this.queue, this.id, this.batchTypes, this.pageMax(), `${this.leaseMs} milliseconds`],
          );
          return r.rows;
        });
        if (rows && rows.length > 0) {
          this.deliverPage(rows);
          claimed = rows.length;
          // A slot stays for the row claim (retries, other types), which
          // pages would otherwise starve while the stream has a backlog.
          free -= this.pageSlots;
        }
      }
      if (free > 0) {
        if (!this.unlisten) await this.listen();
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

  /** Ends the row delivery f: its slot goes to the page's waiting runs, or to the next claim. */
  private ended(f: InFlight): void {
    if (this.inFlight.get(f.id) === f) this.inFlight.delete(f.id);
    if (this.page) this.pumpPage(this.page);
    this.signal();
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
    f.done = this.run(d, token).catch((err: unknown) => this.onError(err)).finally(() => this.ended(f));
  }

  /**
   * The size of the next batch page: pageSize, or what the page's slots
   * finish in half of pageHoldMs at the handlers' recent pace, and at
   * least the slots.
   */
  private pageMax(): number {
    const slots = this.freePageSlots(0);
    if (this.handlerMs === undefined) return Math.min(slots, this.pageSize);
    const fits = Math.floor((slots * this.pageHoldMs) / 2 / Math.max(this.handlerMs, 0.001));
    return Math.min(this.pageSize, Math.max(slots, fits));
  }

  /**
   * How many of a page's runs may run at once with active running: the
   * page's slots, less the deliveries of this worker in its row leases
   * (promoted runs of earlier pages included), so that no more than
   * concurrency handlers run at once.
   */
  private freePageSlots(active: number): number {
    return Math.max(0, Math.min(this.pageSlots, this.concurrency - this.inFlight.size) - active);
  }

  /**
   * Delivers a page of a batch (the rows of one claim_batch): its effects
   * run through the page's slots; at the cut (every one returned, or
   * pageHoldMs passed) the page settles in one call, the ones still
   * running promoted to leases of their own.
   */
  private deliverPage(rows: Array<Record<string, unknown>>): void {
    const first = rows[0];
    let cutNow = (): void => {};
    const cut = new Promise<void>((resolve) => {
      cutNow = resolve;
    });
    const page: Page = {
      batchId: String(first.batch_id),
      token: String(first.batch_token),
      through: String(first.through),
      runs: rows.map((row) => {
        const abort = new AbortController();
        return { d: this.delivery(row, abort.signal), abort, state: "waiting", err: undefined, ended: Promise.resolve() };
      }),
      next: 0,
      active: 0,
      ended: 0,
      cut: false,
      cutNow,
      done: Promise.resolve(),
      over: false,
    };
    this.page = page;
    const hold = setTimeout(cutNow, this.pageHoldMs);
    this.pumpPage(page);
    page.done = cut
      .then(() => {
        clearTimeout(hold);
        return this.settlePage(page);
      })
      .catch((err: unknown) => this.onError(err))
      .finally(() => {
        if (this.page === page) this.page = undefined;
        this.signal();
      });
  }

  /** Starts page's waiting runs while it has free slots. */
  private pumpPage(page: Page): void {
    while (!page.cut && page.next < page.runs.length && this.freePageSlots(page.active) > 0) {
      const r = page.runs[page.next++];
      r.state = "running";
      page.active++;
      const t0 = performance.now();
      r.ended = invoke(this.types[r.d.type], r.d);
      void r.ended.then((err) => {
        const ms = performance.now() - t0;
        this.handlerMs = this.handlerMs === undefined ? ms : 0.8 * this.handlerMs + 0.2 * ms;
        r.state = "done";
        r.err = err;
        page.active--;
        page.ended++;
        if (page.ended === page.runs.length) page.cutNow();
        else this.pumpPage(page);
      });
    }
  }

  /**
   * Settles page at its cut: the returned runs' outcomes, the running ones
   * promoted to leases of this worker (then finished like claimed rows),
   * the ones not started moved unrun. A lost lease aborts what still runs.
   */
  private async settlePage(page: Page): Promise<void> {
    page.cut = true;
    if (page.over) return;
    const delivered: string[] = [];
    const failed: Array<{ id: string; outcome: Outcome; error: string; after: string | null }> = [];
    const running: PageRun[] = [];
    for (const r of page.runs) {
      if (r.state === "done" && r.err === undefined) delivered.push(r.d.id);
      else if (r.state === "done") failed.push({ id: r.d.id, ...classify(r.err, true) });
      else if (r.state === "running") running.push(r);
    }
    const res = await this.call("settle batch", () =>
      this.pool.query(
        "SELECT settled, lease_ids::text[] AS lease_ids, lease_tokens::text[] AS lease_tokens FROM pgoutbox.settle_page($1, $2::bigint, $3::uuid, $4::bigint, $5, $6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::interval[], $11::bigint[], $12::interval, $13::interval)",
        [
          this.queue,
          page.batchId,
          page.token,
          page.through,
          this.id,
          delivered,
          failed.map((f) => f.id),
          failed.map((f) => f.outcome),
          failed.map((f) => f.error),
          failed.map((f) => f.after),
          running.map((r) => r.d.id),
          `${this.leaseMs} milliseconds`,
          `${this.backoffCapMs} milliseconds`,
        ],
      ),
    );
    const out = res?.rows[0];
    const ids = (out?.lease_ids as string[] | null) ?? [];
    const tokens = (out?.lease_tokens as string[] | null) ?? [];
    if (out?.settled !== true || ids.length !== running.length) {
      // The lease was lost (or the settle's outcome is unknown): what still
      // runs is no longer ours.
      page.over = true;
      for (const r of running) r.abort.abort(new Error("pgoutbox: lease lost"));
      return;
    }
    running.forEach((r, i) => {
      const d = r.d;
      const f: InFlight = { id: d.id, token: tokens[i], type: d.type, abort: r.abort, done: Promise.resolve() };
      this.inFlight.set(d.id, f);
      f.done = r.ended
        .then((herr) => (d.signal.aborted ? undefined : this.finish(d, tokens[i], true, herr)))
        .catch((err: unknown) => this.onError(err))
        .finally(() => this.ended(f));
    });
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
      herr = await invoke(t, d);
    }
    if (d.signal.aborted) return; // lost or given back: the outcome is no longer ours to write
    await this.finish(d, token, replaySafe, herr);
  }

  /** Records the outcome herr (undefined: delivered) of d under its lease token. */
  private async finish(d: Delivery, token: string, replaySafe: boolean, herr: unknown): Promise<void> {
    const fence = [d.id, token, d.type];
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
    if (page && !page.over && !page.cut) {
      const r = await this.call("extend batch", () =>
        this.pool.query("SELECT pgoutbox.extend_batch($1, $2::bigint, $3::uuid, $4::interval) AS ok", [
          this.queue,
          page.batchId,
          page.token,
          `${this.leaseMs} milliseconds`,
        ]),
      );
      if (r && r.rows[0]?.ok !== true && !page.over) {
        // Another worker took the batch over: nothing of the page is ours.
        page.over = true;
        for (const run of page.runs) run.abort.abort(new Error("pgoutbox: lease lost"));
        page.cutNow();
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
 * Runs t's handler on d: undefined when it succeeds, else its error (a
 * nullish throw, or a synchronous one, becomes an Error too).
 */
function invoke(t: EffectType, d: Delivery): Promise<unknown> {
  return (async () => t.handler(d))().then(
    () => undefined,
    (err: unknown) => err ?? new Error("handler threw a nullish value"),
  );
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
