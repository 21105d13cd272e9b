# pgoutbox — every target works on a fresh machine with Go and the PostgreSQL
# binaries installed (no server needs to run: tests start a throwaway cluster).

GO      ?= go
PKGS    ?= ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/pgoutbox/pgoutbox/internal/cli.Version=$(VERSION)

.PHONY: demo test test-batch test-batch-reliability test-deps test-short bench bench-curves bench-flat bench-xmin bench-backlog10m build lint fmt vet staticcheck clean

## demo: the whole system with GitHub and Solr emulators, on the embedded PostgreSQL under ./.pgoutbox (or DATABASE_URL)
demo: build
	./scripts/test-deps postgres
	./bin/pgoutbox demo

## test: install missing test dependencies (Debian), vet, then every test against a real PostgreSQL
## (test/anylang builds clients/typescript: npm ci when needed, then tsc)
test: test-deps vet
	$(GO) test -count=1 -timeout 45m $(PKGS)
	$(MAKE) test-batch

## test-batch: the root package's tests and the reliability campaign again with every queue in batch storage, in 4
## lanes (the storage test matrix)
test-batch:
	PGOUTBOX_TEST_STORAGE=batch PGOUTBOX_TEST_LANES=4 $(GO) test -count=1 -timeout 30m .
	$(MAKE) test-batch-reliability

## test-batch-reliability: the reliability campaign (test/reliability) with every queue in batch storage, in 4 lanes
## (5-10 min on 2 shared cores); `make test` runs it after the root package's batch run
test-batch-reliability:
	PGOUTBOX_TEST_STORAGE=batch PGOUTBOX_TEST_LANES=4 $(GO) test -count=1 -timeout 30m ./test/reliability

## test-deps: PostgreSQL binaries, Virtuoso, rdflib, Chromium, promtool, Node.js, npm and psycopg, when missing (apt-get)
test-deps:
	./scripts/test-deps

## test-short: the quick tests: skips the 100,000-effect drains, the reliability campaign (test/reliability), the NATS relay drain, the projection's Solr, SPARQL and import runs, and the embedded-cluster CLI tests
test-short:
	$(GO) test -count=1 -short $(PKGS)

## bench: River, PgQ, pgoutbox (row-lock and durable leases, batch storage) and the SQL ceilings (lease modes, DELETE)
## side by side (bench/, ~25 min) on a PostgreSQL with default settings under .pgoutbox-bench (stopped afterwards;
## DATABASE_URL: that server instead, which may CREATE DATABASE; PgQ is installed from Debian's postgresql-NN-pgq3 when
## missing, skipped with a note when unavailable), then the NATS relay benchmarks
BENCH_PG ?= $(CURDIR)/.pgoutbox-bench
bench: build
	./scripts/test-deps bench
	cd bench && $(GO) run . $(if $(DATABASE_URL),,-local $(BENCH_PG)) $(BENCHFLAGS)
	$(if $(DATABASE_URL),,./bin/pgoutbox --data-dir $(BENCH_PG) embedded stop)
	PGOUTBOX_BENCH_N=20000 $(GO) test -run '^$$' -bench . -benchtime 1x ./adapters/nats

## bench-curves: drain rate, worker RSS, WAL and PostgreSQL CPU per effect against backlog (100k, 1M, 5M), payload
## (300 B, 4 KiB, 32 KiB) and worker processes (1, 2, 4), River, pgoutbox (row-lock, the default; durable) and the
## row-lock ceiling side by side (about an hour on 2 cores);
## writes docs/bench/curves.json and docs/bench/curve-*.svg. Smaller: BENCHFLAGS='-curve-backlogs 10000,50000 -curve-n 10000'
bench-curves: build
	./scripts/test-deps postgres
	cd bench && $(GO) run . -curves -rounds 1 -timeout 60m -systems 'river,pgoutbox,pgoutbox[row-lock=off],ceiling[row-lock]' \
		$(if $(DATABASE_URL),,-local $(BENCH_PG)) -json ../docs/bench/curves.json -svg ../docs/bench $(BENCHFLAGS)
	$(if $(DATABASE_URL),,./bin/pgoutbox --data-dir $(BENCH_PG) embedded stop)

## bench-flat: issue 32's "Flat": bench-backlog10m, then bench-xmin (about three hours on 2 cores)
bench-flat: bench-backlog10m bench-xmin

## bench-backlog10m: drain at 100k and 10M effects pre-inserted, River and pgoutbox (row-lock; durable; batch storage), the
## 10M / 100k ratio printed; writes docs/bench/flat/backlog.json and its SVGs into docs/bench/flat (~80-120 min; ~30 GB of disk)
bench-backlog10m: build
	./scripts/test-deps postgres
	cd bench && $(GO) run . -curves -rounds 1 -timeout 90m -systems 'river,pgoutbox,pgoutbox[row-lock=off],pgoutbox[storage=batch]' \
		-curve-backlogs 100000,10000000 -curve-payloads 300 -curve-procs 1 \
		$(if $(DATABASE_URL),,-local $(BENCH_PG)) -json ../docs/bench/flat/backlog.json -svg ../docs/bench/flat $(BENCHFLAGS)
	$(if $(DATABASE_URL),,./bin/pgoutbox --data-dir $(BENCH_PG) embedded stop)

## bench-xmin: producers at 50 % of capacity through a 5-minute clean phase, a 10-minute held XID and the recovery,
## River and pgoutbox (row-lock; durable; batch storage); writes docs/bench/flat/xmin.json and xmin.svg (~80 min)
bench-xmin: build
	./scripts/test-deps postgres
	cd bench && $(GO) run . -xmin -systems 'river,pgoutbox,pgoutbox[row-lock=off],pgoutbox[storage=batch]' \
		$(if $(DATABASE_URL),,-local $(BENCH_PG)) -json ../docs/bench/flat/xmin.json -svg ../docs/bench/flat $(BENCHFLAGS)
	$(if $(DATABASE_URL),,./bin/pgoutbox --data-dir $(BENCH_PG) embedded stop)

## build: the pgoutbox binary in ./bin
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/pgoutbox ./cmd/pgoutbox

## lint: gofmt, go vet and staticcheck
lint: fmt vet staticcheck

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

clean:
	rm -rf bin
