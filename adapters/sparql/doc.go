// Package sparql projects records to a SPARQL 1.1 graph store (GraphDB by
// default, any SPARQL 1.1 Update endpoint when UpdateURL is set): one named
// graph per record, replaced in one request by
//
//	DROP SILENT GRAPH <g> ;
//	INSERT DATA { GRAPH <g> { … } }
//
// so that a replay or a duplicate delivery leaves exactly one graph holding
// exactly the record's current triples, and the store never holds half a
// record. The graph (and subject) IRI is GraphPrefix + the percent-encoded
// record id; each top-level field becomes one triple per value with the
// predicate FieldPrefix + the percent-encoded field name: strings as plain
// literals, numbers exactly (xsd:integer within int64, else xsd:decimal up
// to MaxDecimalDigits digits and MaxFractionDigits after the point, else a
// plain literal of the number's text; never xsd:double), booleans as
// xsd:boolean, nested objects and arrays of objects as rdf:JSON literals,
// arrays of scalars as one triple per element; null is omitted. Two
// bookkeeping triples hold the record version (VersionPredicate) and source
// hash (HashPredicate). String literals read back exactly whether or not the
// parser expands codepoint escapes before parsing (SPARQL 1.1 §19.2).
//
// The update is sent as the "update" form parameter
// (application/x-www-form-urlencoded, SPARQL 1.1 Protocol §2.2.1), with HTTP
// basic auth when a username is set; with Config.GraphStoreURL the graph is
// instead replaced by a Graph Store Protocol PUT of N-Triples. Errors are pgoutbox outcomes: 5xx, 408,
// 429 and transport errors retry (on 429 and 503 no earlier than
// Retry-After, delay-seconds or an HTTP-date measured from the answer's
// Date), any other 4xx is permanent; error text never carries the password.
//
// Ordering: the graph store has no conditional replace that a single
// DROP/INSERT request can carry, so out-of-order safety comes from the
// caller. The record projection serializes the deliveries of one record and
// always sends the record's current state (see package projection).
package sparql
