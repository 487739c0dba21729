# Fleet. The two commands for a fresh machine are `make demo` and `make test`.

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/fleet-dev/fleet/internal/version.Version=$(VERSION)
BIN       := bin
TESTFLAGS ?= -race -count=1 -timeout 45m

.PHONY: all build demo test bench lint fuzz clean

all: build

## build: the dispatcher, worker and fleetctl binaries, in bin/
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/dispatcher ./cmd/worker ./cmd/fleetctl

## demo: run a whole fleet on this machine and show it working
demo: build
	./scripts/demo.sh

## test: the whole test suite (real NATS, Redis and Docker; CI=true makes a missing one fail)
test: lint
	$(GO) test $(TESTFLAGS) ./...

## bench: Go benchmarks of the hot paths, then the load test through the whole fleet
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./internal/... ./job/...
	./scripts/bench.sh

## lint: formatting and vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
