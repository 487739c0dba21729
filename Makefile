# Fleet. The two commands for a fresh machine are `make demo` and `make test`.

SHELL     := bash
GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/fleet-dev/fleet/internal/version.Version=$(VERSION)
BIN       := bin
TESTFLAGS ?= -race -count=1 -timeout 45m
# Test binaries run at once by make test: most of a test's time is spent
# waiting (for servers, elections, processes), and with go test's default
# (one per core) this 2-core machine used under half its CPU.
TESTP     ?= 3
IMAGE     ?= fleet:dev

.PHONY: all build demo test flakes bench bench-console bench-feed bench-failover lint fuzz image image-release tools screenshots clean

all: build

## build: the dispatcher, worker and fleetctl binaries, static, in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/dispatcher ./cmd/worker ./cmd/fleetctl

## image: the container image from the binaries in bin/ (no registry needed)
image: build
	docker build --target runtime-local -t $(IMAGE) .

## image-release: the multi-stage image, built from source (BuildKit; needs a registry)
image-release:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

## tools: helm and Docker Compose v2, for the deployment tests
tools:
	hack/tools/build.sh

## demo: run a whole fleet on this machine and show it working
demo: build
	./scripts/demo.sh

## test: the whole test suite (real NATS, Redis and Docker; CI=true makes a missing one fail);
## the console's tests run alone once the rest is done, in Chromium: Chromium fails the
## connections it is making whenever the host's addresses change, which other tests' Docker
## networks and containers do. The output is a plain go test's (internal/testlog reads -json), and
## the slowest twenty tests are printed at the end. Latency and throughput targets are make
## bench's and make bench-failover's: a test asserts what holds whatever the load.
CONSOLE := ./internal/console
# The longest packages first, so that none of them is left to run alone at the end.
SLOWEST := ./internal/e2e ./internal/e2e/failover ./internal/deploytest ./internal/e2e/artifacts ./internal/e2e/longjobs
TESTTIMES ?= $(or $(TMPDIR),/tmp)/fleet-test-times
TESTLOG := $(BIN)/testlog
test: lint
	@rm -f $(TESTTIMES)
	$(GO) build -o $(TESTLOG) ./internal/testlog
	set -o pipefail; $(GO) test -json -p $(TESTP) $(TESTFLAGS) $$($(GO) list $(SLOWEST) ./... | grep -v -e '/internal/console$$') | $(TESTLOG) -times $(TESTTIMES)
	set -o pipefail; $(GO) test -json $(TESTFLAGS) $(CONSOLE) | $(TESTLOG) -times $(TESTTIMES)
	@$(TESTLOG) -slowest 20 $(TESTTIMES)

## bench: Go benchmarks of the hot paths (with BenchmarkReserve: a reservation with Redis up, away and hung; BenchmarkServerOperationsPerJob: what a no-op job asks of the NATS server and what it delivers, by kind; BenchmarkFirstJobOfNewTenant: a new tenant's first job beside an established tenant's, submission to start; BenchmarkSchedules: 1,000 schedules every second for a minute, FLEET_BENCH_SCHEDULES_FOR=10s for a quick try), the load test through the whole fleet, sharing a pool (one and ten tenants) against the fleet of before, Kubernetes against the bare Job cycle, then artifacts (upload vs a raw Put, log archiving on vs off)
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./job/ ./internal/dispatcher/ ./internal/worker/ ./internal/producer/ ./internal/telemetry/ ./internal/capacity/ledger/
	$(GO) test -run '^$$' -bench ServerOperationsPerJob -benchtime 5000x -v ./internal/e2e/ | grep -v '^=== '
	./scripts/bench.sh
	./scripts/bench-sharing.sh
	./scripts/bench-kube.sh
	./scripts/bench-artifacts.sh

## flakes: the tests of PKGS (RUN: those matching; no PKGS: the census of docs/tests.md, every package whose tests start servers or processes) RUNS times (20) as make test runs them, LOAD=1 beside a load; every failure counted. Run it on each new test before it lands
flakes:
	./scripts/flakes.sh -n $(or $(RUNS),20) $(if $(RUN),-r '$(RUN)') $(if $(LOAD),-l) $(PKGS)

## bench-failover: the failover tests (NATS servers killed) and the Redis outage tests RUNS times (3), each beside its undisturbed run and held to its latency and throughput targets, each run printed
bench-failover:
	./scripts/bench-failover.sh

## bench-feed: the no-op throughput with the tenants' feeds kept and not (--feeds=false), side by side, ROUNDS (5) alternating, medians
bench-feed: build
	./scripts/bench-toggle.sh feeds

## bench-console: the no-op throughput with the console on (two pages open) and off, side by side
bench-console: build
	./scripts/bench-toggle.sh console

## screenshots: the pictures of docs/console.md (docs/console-*.png), from a fleet in the test, through headless Chromium
screenshots:
	FLEET_SCREENSHOTS=$(CURDIR)/docs $(GO) test -tags screenshots -count=1 -run '^TestConsoleScreenshots$$' ./internal/console/

## fuzz: every fuzz target for FUZZTIME each (make test runs their seed corpora)
FUZZTIME ?= 60s
FUZZPKGS := ./job/ ./internal/queue/ ./internal/capacity/ ./internal/console/
fuzz:
	@set -e; for pkg in $(FUZZPKGS); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

## lint: formatting and vet, and no tracked file over 1 MiB (a binary or build output committed by mistake)
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@big=$$(git ls-files -z 2>/dev/null | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 { print $$2 }'); \
	  if [ -n "$$big" ]; then echo "tracked files over 1 MiB (build output? keep it out and in .gitignore):"; echo "$$big"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
