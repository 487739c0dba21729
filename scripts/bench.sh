#!/usr/bin/env bash
# make bench: the load test through the whole fleet. Starts an embedded
# dispatcher (NATS with file storage, and the Redis-protocol store) and one
# worker, and pushes jobs through submit -> dispatcher -> JetStream ->
# worker -> result with `fleetctl bench`:
#   1. throughput with the noop executor (the fleet's own overhead), with
#      slot accounting in Redis, then without it;
#   2. latency at a paced 1,000 jobs/s with the noop executor;
#   3. throughput with the process executor running `true`;
#   4. with Docker: a fleet job running `true` in a container, one at a
#      time, against the bare Docker API cycle of the same image.
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
metrics=127.0.0.1:18181

# The workers' workspaces go to tmpfs when there is one: on this kind of
# disk a directory costs ~150 µs to make and as much to remove, which would
# measure the disk, not the fleet (JetStream's files stay on the disk).
workdir=$data/worker
[ -d /dev/shm ] && workdir=$(mktemp -d /dev/shm/fleet-bench.XXXXXX)

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$data" "$workdir"
}
trap cleanup EXIT

# Slot accounting goes to a real redis-server when one is installed, as in
# production; else to the dispatcher's embedded Redis-protocol store, whose
# Lua interpreter costs much more per call.
redis="embedded Redis-protocol store"
dispatcher_redis=$FLEET_REDIS_URL
if command -v redis-server >/dev/null; then
	redis-server --bind 127.0.0.1 --port 16479 --save '' --appendonly no >"$data/redis.log" 2>&1 &
	pids+=($!)
	redis="redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -c3-)"
	dispatcher_redis=""
	sleep 0.5
fi
"$bin/dispatcher" --embedded --admission off --redis-url "$dispatcher_redis" >"$data/dispatcher.log" 2>&1 &
dpid=$!
pids+=($dpid)
for _ in $(seq 150); do
	code=0
	"$bin/fleetctl" status not-a-job >/dev/null 2>&1 || code=$?
	[ "$code" = 3 ] && break
	sleep 0.1
done

# worker EXECUTOR [flags...]: starts a worker, sets wpid.
worker() {
	local executor=$1
	shift
	"$bin/worker" --executor "$executor" --slots "$slots" --id "bench-$executor" --metrics-addr "$metrics" \
		--data-dir "$workdir" "$@" \
		>"$data/worker-$executor.log" 2>&1 &
	wpid=$!
	pids+=($wpid)
	sleep 1
}
stop_worker() { kill -TERM "$wpid"; wait "$wpid" 2>/dev/null || true; }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(go version | cut -d' ' -f3)"
echo "fleet: dispatcher --embedded (NATS with file storage inside it) + one worker with $slots slots; leases in $redis"
echo "CPU per job is the dispatcher's plus the worker's"

worker noop
echo; echo "== noop executor, $jobs jobs as fast as possible, slots leased in Redis"
"$bin/fleetctl" bench --jobs "$jobs" --pids "$dpid,$wpid" --metrics "http://$metrics/metrics"
echo; echo "== noop executor, 5000 jobs offered at 1000/s"
"$bin/fleetctl" bench --jobs 5000 --rate 1000 --pids "$dpid,$wpid"
stop_worker

worker noop --redis-url ""
echo; echo "== noop executor, $jobs jobs as fast as possible, without slot accounting"
"$bin/fleetctl" bench --jobs "$jobs" --pids "$dpid,$wpid"
stop_worker

worker process
echo; echo "== process executor running true, $((jobs / 4)) jobs as fast as possible"
"$bin/fleetctl" bench --jobs "$((jobs / 4))" --command true --pids "$dpid,$wpid"
stop_worker

if docker info >/dev/null 2>&1; then
	n=${DOCKER_JOBS:-20}
	echo; echo "== docker: true in fleet-test/testprog, $n one at a time"
	go test -run '^$' -bench 'BareDockerCycle' -benchtime "${n}x" ./internal/executor/docker/ | grep Benchmark
	slots=1 worker docker
	"$bin/fleetctl" bench --jobs "$n" --image fleet-test/testprog:latest --command true
fi
