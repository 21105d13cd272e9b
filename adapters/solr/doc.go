// Package solr projects records to Apache Solr with the JSON update handler:
// one add per record, replacing the document with the same id (uniqueKey
// "id", overwrite=true) and made searchable by commitWithin, with HTTP basic
// auth when a username is set.
//
// # Out-of-order safety
//
// Every document carries the record version it was projected from
// (VersionField, pgoutbox_version_l) and the record's source hash
// (HashField). [Client.Upsert] first reads the stored document with the
// real-time get handler (/get, which sees uncommitted updates), and:
//
//   - sends nothing when Solr holds a newer version (SkippedNewer) or the
//     same version and hash (AlreadyCurrent: a replay or duplicate delivery);
//   - otherwise adds the document with Solr's optimistic concurrency: the add
//     carries the _version_ it read (or -1, "must not exist"), so a
//     concurrent writer makes Solr answer 409 and Upsert reads again and
//     decides again (up to ConflictRetries times, then a retry).
//
// An older record version therefore never replaces a newer one, whatever
// order deliveries arrive in. This needs Solr's update log (on in every
// default configset), which optimistic concurrency and real-time get rely
// on.
//
// # Field names
//
// Record fields are sent under [FieldName]: names Solr's reference guide
// allows are kept, reserved and invalid ones (_childDocuments_, "", a
// hyphen, a leading digit…) are mapped deterministically and one-to-one
// under MappedFieldPrefix, so no record dead-letters on a name and no field
// overrides id, _version_ or the handler's own fields.
//
// # Outcomes
//
// Errors are pgoutbox outcomes: 5xx, 408, 429 and transport errors are
// retries (on 429 and 503 no earlier than Retry-After, delay-seconds or
// an HTTP-date measured from the answer's Date), a lost response is
// ambiguous (a retry for this replay-safe effect), any other 4xx (401, 403,
// 400, 404) is permanent. Error text never contains the password, and URLs
// never carry credentials (Validate refuses them).
package solr
