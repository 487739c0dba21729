#!/usr/bin/env bash
# make bench: the load test through the whole fleet. Starts an embedded
# dispatcher and one worker, and pushes jobs through submit -> dispatcher ->
# JetStream -> worker -> result with `fleetctl bench`:
#   1. throughput with the noop executor (the fleet's own overhead),
#   2. latency at a paced 1,000 jobs/s with the noop executor,
#   3. throughput with the process executor running `true`.
# JOBS and SLOTS override the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=./bin
jobs=${JOBS:-20000}
slots=${SLOTS:-256}
data=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench.XXXXXX")
export FLEET_NATS_URL=nats://127.0.0.1:14322
export FLEET_REDIS_URL=redis://127.0.0.1:16479/0
export FLEET_HTTP_ADDR=127.0.0.1:18180
export FLEET_DATA_DIR=$data
export FLEET_LOG_LEVEL=warn

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$data"
}
trap cleanup EXIT

"$bin/dispatcher" --embedded >"$data/dispatcher.log" 2>&1 &
dpid=$!
pids+=($dpid)
for _ in $(seq 150); do
	code=0
	"$bin/fleetctl" status not-a-job >/dev/null 2>&1 || code=$?
	[ "$code" = 3 ] && break
	sleep 0.1
done

worker() {
	"$bin/worker" --executor "$1" --slots "${slots}" --id "bench-$1" >"$data/worker-$1.log" 2>&1 &
	wpid=$!
	pids+=($wpid)
	sleep 1
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(go version | cut -d' ' -f3)"
echo "fleet: dispatcher --embedded (file storage) + one worker with $slots slots; CPU is the dispatcher's (with NATS inside it) plus the worker's"

worker noop
echo; echo "== noop executor, $jobs jobs as fast as possible"
"$bin/fleetctl" bench --jobs "$jobs" --pids "$dpid,$wpid"
echo; echo "== noop executor, 5000 jobs offered at 1000/s"
"$bin/fleetctl" bench --jobs 5000 --rate 1000 --pids "$dpid,$wpid"
kill -TERM "$wpid"; wait "$wpid" 2>/dev/null || true

worker process
echo; echo "== process executor running true, $((jobs / 4)) jobs as fast as possible"
"$bin/fleetctl" bench --jobs "$((jobs / 4))" --command true --pids "$dpid,$wpid"
kill -TERM "$wpid"; wait "$wpid" 2>/dev/null || true

if docker info >/dev/null 2>&1; then
	# The same image and command, one container at a time: the bare Docker
	# API cycle (create, start, wait, remove) against a whole fleet job.
	n=${DOCKER_JOBS:-20}
	echo; echo "== docker: true in fleet-test/testprog, $n one at a time"
	go test -run '^$' -bench 'BareDockerCycle' -benchtime "${n}x" ./internal/executor/docker/ | grep Benchmark
	slots=1 worker docker
	"$bin/fleetctl" bench --jobs "$n" --image fleet-test/testprog:latest --command true
fi
