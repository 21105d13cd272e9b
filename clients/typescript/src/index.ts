/**
 * @pgoutbox/client: enqueue pgoutbox effects from TypeScript inside the
 * caller's own PostgreSQL transaction.
 *
 * Every rule (field bounds, the 64 KiB payload bound, the credential-key
 * guard, duplicate keys) is enforced by the database's SQL API
 * (pgoutbox.enqueue and pgoutbox.enqueue_batch, docs/any-language.md), the
 * same rules as Go's Enqueue: this package only shapes the call, so the
 * verdict cannot drift from the engine's.
 *
 * @packageDocumentation
 */
import { createHash } from "node:crypto";

/** An effect owed to the outside world, written in the same transaction as the state change that caused it. */
export interface Effect {
  /** Selects the worker pool: 1-128 bytes, not only white space. */
  queue: string;
  /** The registered effect type (e.g. "record.upsert"): 1-128 bytes. */
  type: string;
  /**
   * The idempotency key, unique per queue (1-512 bytes): enqueuing a key
   * that exists returns the existing id and writes nothing. Build it with
   * {@link key}.
   */
  key: string;
  /**
   * Any JSON value, encoded with JSON.stringify; undefined means {}. At most
   * 65,536 bytes encoded, and no object key at any depth may look like a
   * credential (token, secret, password, api_key, ...).
   */
  payload?: unknown;
  /** Delivery attempts before dead-lettering, 0-1000; 0 or undefined means 8. */
  maxAttempts?: number;
  /**
   * Schedules the first attempt at an absolute instant (compared with the
   * database clock); undefined means now(). A string must be ISO 8601 with
   * a zone. To delay by a duration, use delayMs.
   */
  availableAt?: Date | string;
  /**
   * Schedules the first attempt delayMs milliseconds after the enqueue, on
   * the database clock (now() + delay), whatever this process's clock says.
   * Not negative, and not with availableAt; undefined means no delay.
   */
  delayMs?: number;
  /**
   * Orders the effect among the queue's effects with the same ordering key:
   * they are delivered one at a time, in the order their transactions
   * committed (Go's Effect.OrderingKey; 1-512 bytes, not only white space).
   * The enqueue holds the key's ordering lock until the transaction ends.
   * Undefined means none.
   */
  orderingKey?: string;
  /**
   * The W3C traceparent the delivery continues ("00-<trace id>-<parent
   * id>-<flags>", lower-case hex; docs/operations.md "Tracing"). undefined
   * means the active span's, read through @opentelemetry/api when that
   * package is installed and a span is active; null means none. Anything
   * else but a version-00 traceparent is refused (OB001).
   */
  traceparent?: string | null;
}

/**
 * What the functions run on: a node-postgres Client or PoolClient that is
 * inside the caller's transaction (BEGIN ... COMMIT), or anything with the
 * same query method. Not a Pool: each pool query may run on another
 * connection, outside the transaction.
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
}

/** A parameterized statement, for drivers other than node-postgres ($1, $2, ... placeholders). */
export interface Statement {
  text: string;
  values: unknown[];
}

/** The SQLSTATEs of the SQL API's refusals (the error's `code`). */
export const SQLState = {
  /** A field out of its bounds, or a malformed batch. */
  InvalidEffect: "OB001",
  /** The payload is over 65,536 bytes. */
  PayloadTooLarge: "OB002",
  /** A payload key looks like a credential; the message names its path, never its value. */
  CredentialKey: "OB003",
  /**
   * PostgreSQL's insufficient_privilege: the caller's role may not enqueue
   * this queue and type (the owner grants it with pgoutbox.grant_enqueue), or
   * the key is taken by an effect it may not enqueue. The message names the
   * role, the queue and the type.
   */
  NotAuthorized: "42501",
} as const;

/** The largest payload, in bytes of JSON (MaxPayloadBytes in Go). */
export const MAX_PAYLOAD_BYTES = 65536;

/**
 * Returns a deterministic idempotency key: the hex SHA-256 of the parts
 * joined by "|" (UTF-8), equal to Go's pgoutbox.Key and SQL's pgoutbox.key.
 */
export function key(...parts: string[]): string {
  for (const p of parts) {
    if (typeof p !== "string") {
      throw new TypeError(`pgoutbox: key parts must be strings, not ${typeof p}`);
    }
  }
  return createHash("sha256").update(parts.join("|"), "utf8").digest("hex");
}

/**
 * Reports whether err is a refusal of the SQL API (an error whose code is
 * one of {@link SQLState}), optionally a given one.
 */
export function isRefusal(err: unknown, code?: (typeof SQLState)[keyof typeof SQLState]): err is Error & { code: string } {
  if (typeof err !== "object" || err === null) return false;
  const c = (err as { code?: unknown }).code;
  if (typeof c !== "string") return false;
  return code === undefined ? Object.values(SQLState).includes(c as never) : c === code;
}

function encodePayload(payload: unknown): string | null {
  if (payload === undefined) return null;
  const text = JSON.stringify(payload);
  if (text === undefined) {
    throw new TypeError(`pgoutbox: payload cannot be encoded as JSON (${typeof payload})`);
  }
  return text;
}

function encodeTime(t: Date | string | undefined): string | null {
  if (t === undefined) return null;
  if (t instanceof Date) {
    if (Number.isNaN(t.getTime())) throw new TypeError("pgoutbox: availableAt is an invalid Date");
    return t.toISOString();
  }
  return t;
}

// checkAttempts refuses what JSON or a bind parameter would turn into
// something else (NaN and Infinity become null in JSON, 2.5 fails the
// integer cast of one form but not the other); the bounds are the
// database's to check.
function checkAttempts(n: number): number {
  if (typeof n !== "number" || !Number.isInteger(n)) {
    throw new TypeError(`pgoutbox: maxAttempts must be an integer, not ${String(n)}`);
  }
  return n;
}

function checkDelay(ms: number): number {
  if (typeof ms !== "number" || !Number.isFinite(ms)) {
    throw new TypeError(`pgoutbox: delayMs must be a finite number of milliseconds, not ${String(ms)}`);
  }
  return ms;
}

/** The parts of @opentelemetry/api's that {@link activeTraceparent} reads. */
interface OtelAPI {
  context: { active(): unknown };
  trace: {
    getSpanContext(ctx: unknown): { traceId: string; spanId: string; traceFlags: number } | undefined;
    isSpanContextValid(sc: { traceId: string; spanId: string }): boolean;
  };
}

let otelAPI: Promise<OtelAPI | null> | undefined;

// loadOtelAPI imports @opentelemetry/api once, when it is installed (an
// optional peer dependency: without it, enqueue keeps no traceparent). The
// name is a variable so that TypeScript does not need the package.
function loadOtelAPI(): Promise<OtelAPI | null> {
  const name = "@opentelemetry/api";
  otelAPI ??= import(name).then(
    (m: OtelAPI & { default?: OtelAPI }) => (m.trace ? m : (m.default ?? null)),
    () => null,
  );
  return otelAPI;
}

/**
 * Returns the W3C traceparent of the active span, read through
 * @opentelemetry/api when that package is installed, or undefined (no
 * package, no active span).
 */
export async function activeTraceparent(): Promise<string | undefined> {
  const api = await loadOtelAPI();
  const sc = api?.trace.getSpanContext(api.context.active());
  if (!api || !sc || !api.trace.isSpanContextValid(sc)) return undefined;
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

// withTraceparent fills an effect's undefined traceparent with the active
// span's, if any.
async function withTraceparent(effect: Effect): Promise<Effect> {
  if (effect?.traceparent !== undefined) return effect;
  const traceparent = await activeTraceparent();
  return traceparent === undefined ? effect : { ...effect, traceparent };
}

/**
 * The statement {@link enqueue} runs, for drivers other than node-postgres.
 * Its one row has the column id. A traceparent is passed only when the
 * effect has one, so the statement without it runs on databases migrated
 * before version 24.
 */
export function enqueueStatement(effect: Effect): Statement {
  const traced = effect.traceparent !== undefined && effect.traceparent !== null;
  return {
    text:
      "SELECT pgoutbox.enqueue($1, $2, $3, $4::text::json, $5::integer, $6::timestamptz, $7::interval, $8::text" +
      (traced ? ", traceparent => $9::text" : "") +
      ")::text AS id",
    values: [
      effect.queue,
      effect.type,
      effect.key,
      encodePayload(effect.payload),
      effect.maxAttempts === undefined ? null : checkAttempts(effect.maxAttempts),
      encodeTime(effect.availableAt),
      effect.delayMs === undefined ? null : `${checkDelay(effect.delayMs)} milliseconds`,
      effect.orderingKey === undefined ? null : effect.orderingKey,
      ...(traced ? [effect.traceparent] : []),
    ],
  };
}

/** The statement {@link enqueueBatch} runs. Its rows are (idx, id), one per effect, in input order. */
export function enqueueBatchStatement(effects: readonly Effect[]): Statement {
  const rows = effects.map((e) => {
    // The envelope is written by hand so that the payload's JSON text is
    // exactly the one enqueue would send (and counted against the same bound).
    const fields = [
      `"queue":${JSON.stringify(e.queue ?? null)}`,
      `"effect_type":${JSON.stringify(e.type ?? null)}`,
      `"idempotency_key":${JSON.stringify(e.key ?? null)}`,
    ];
    const payload = encodePayload(e.payload);
    if (payload !== null) fields.push(`"payload":${payload}`);
    if (e.maxAttempts !== undefined) fields.push(`"max_attempts":${checkAttempts(e.maxAttempts)}`);
    const at = encodeTime(e.availableAt);
    if (at !== null) fields.push(`"available_at":${JSON.stringify(at)}`);
    if (e.delayMs !== undefined) fields.push(`"delay":${checkDelay(e.delayMs) / 1000}`);
    if (e.orderingKey !== undefined) fields.push(`"ordering_key":${JSON.stringify(e.orderingKey)}`);
    if (e.traceparent !== undefined && e.traceparent !== null) fields.push(`"traceparent":${JSON.stringify(e.traceparent)}`);
    return `{${fields.join(",")}}`;
  });
  return {
    text: "SELECT idx, id::text AS id FROM pgoutbox.enqueue_batch($1::text::json) ORDER BY idx",
    values: [`[${rows.join(",")}]`],
  };
}

function checkQueryable(db: Queryable): void {
  if (db === null || typeof db !== "object" || typeof db.query !== "function") {
    throw new TypeError("pgoutbox: enqueue needs a node-postgres client inside a transaction");
  }
  if (typeof (db as { totalCount?: unknown }).totalCount === "number") {
    throw new TypeError(
      "pgoutbox: enqueue needs the client that holds your transaction (await pool.connect(), BEGIN), not a Pool: " +
        "a pool query runs outside the transaction",
    );
  }
}

/**
 * Writes one effect inside the transaction db is in and returns its id (a
 * decimal string: PostgreSQL bigint). The effect exists if and only if the
 * transaction commits. A key that exists in the queue returns the existing
 * id and writes nothing. Invalid input is refused by the database with an
 * error whose code is one of {@link SQLState} (the transaction is then
 * aborted: roll it back). The effect keeps the active span's traceparent
 * (see {@link Effect.traceparent}).
 */
export async function enqueue(db: Queryable, effect: Effect): Promise<string> {
  checkQueryable(db);
  const st = enqueueStatement(await withTraceparent(effect));
  const { rows } = await db.query(st.text, st.values);
  return String(rows[0]?.id);
}

/**
 * Writes effects inside the transaction db is in, in one statement, and
 * returns their ids in input order. One bad effect refuses the whole batch
 * (the message names its index). Key rows are written in canonical
 * (queue, key) order, so concurrent batches sharing keys cannot deadlock on
 * them.
 */
export async function enqueueBatch(db: Queryable, effects: readonly Effect[]): Promise<string[]> {
  checkQueryable(db);
  if (effects.length === 0) return [];
  const st = enqueueBatchStatement(await Promise.all(effects.map(withTraceparent)));
  const { rows } = await db.query(st.text, st.values);
  return rows.map((r) => String(r.id));
}

export * from "./worker.js";
