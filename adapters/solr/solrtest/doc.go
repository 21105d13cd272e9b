// Package solr is a protocol-faithful, in-memory emulator of the Solr
// handlers the record projection uses: the JSON update handler, real-time
// get and select. Tests and the demo point SOLR_BASE_URL at [Server.URL].
//
// # Protocol
//
//   - POST /solr/{core}/update (and /update/json) with Content-Type
//     application/json takes an array of documents or an object of commands
//     whose keys may repeat: "add" ({"doc", "overwrite", "commitWithin"}),
//     "delete" (an id, a list of ids, or {"id"}), "commit". Query parameters
//     commitWithin, overwrite, commit=true and versions=true are honoured.
//     Other content types answer 415, malformed JSON 400, an unknown core 404.
//   - uniqueKey "id": an add replaces the document with the same id
//     (overwrite=true, the default); overwrite=false stores a duplicate, as
//     Solr does.
//   - Optimistic concurrency on "_version_" in the added document: > 1 must
//     equal the stored version, 1 means the document must exist, < 0 means
//     it must not exist, 0 or absent means no check. A failed check answers
//     409 "version conflict for {id} expected=… actual=…"; commands before the
//     failing one stay applied and the rest are skipped, as in Solr. Every
//     stored document gets a new, strictly increasing _version_.
//   - Visibility: GET /solr/{core}/get (real-time get, ?id= or ?ids=, fl)
//     sees every update at once. GET or POST /solr/{core}/select sees an
//     update only after its commitWithin deadline or a commit; it emulates
//     q and fq as "*:*" or field:value (exact match on the value's string
//     form, any element of a multi-valued field), start, rows and fl.
//   - Authentication: with Options.Username set, every request needs that
//     basic-auth user and password (compared in constant time), otherwise 401
//     with WWW-Authenticate: Basic, like the BasicAuthPlugin with
//     blockUnknown=true.
//   - Field names as Solr's reference guide ("Fields") states them: ASCII
//     letters, digits and underscores, not starting with a digit; names with
//     both leading and trailing underscores are reserved, and of those an
//     added document may carry only _version_. Any other name — empty, with
//     a hyphen, a dot or non-ASCII, "1st", "_root_", "_nest_path_" — answers
//     400 naming the field, as does _childDocuments_ (Solr's key for child
//     documents, which the emulator does not store).
//   - Typed dynamic fields of the _default configset (*_i, *_l, *_f, *_d,
//     *_b, *_dt): a value that does not parse as the type answers 400.
//   - Errors use Solr's body: {"responseHeader":{"status":N},"error":{"msg",
//     "code"}}.
//
// # Faults and inspection
//
// [Server.InjectFault] programs 5xx (with Retry-After), delays and lost
// responses (the update is applied, the connection closed without an
// answer) per handler. [Server.Calls] is the call log (method, path,
// handler, status, fault, documents added; never bodies or credentials).
// [Server.Doc], [Server.Count] and [Server.Commit] inspect and commit;
// [Server.Wait] blocks until a condition holds, re-checked after every
// request, so tests never sleep.
package solrtest
