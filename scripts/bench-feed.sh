#!/usr/bin/env bash
# make bench-feed: what the tenants' feeds cost. The no-op throughput of
# scripts/bench.sh, side by side in one run: a dispatcher keeping the
# feed (--feeds, the default: the final version of each job copied into
# FLEET_FEED_<tenant> by the server) and the same with --feeds=false,
# alternating ROUNDS times; then the median of each and their ratio.
# JOBS and SLOTS override the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=./bin
jobs=${JOBS:-20000}
slots=${SLOTS:-256}
rounds=${ROUNDS:-5}
base=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-feed.XXXXXX")
export FLEET_NATS_URL=nats://127.0.0.1:14423
export FLEET_HTTP_ADDR=127.0.0.1:18281
export FLEET_LOG_LEVEL=warn
workdir=$base/work
[ -d /dev/shm ] && workdir=$(mktemp -d /dev/shm/fleet-bench-feed.XXXXXX)

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$base" "$workdir"
}
trap cleanup EXIT

redis_url=""
if command -v redis-server >/dev/null; then
	redis-server --bind 127.0.0.1 --port 16580 --save '' --appendonly no >"$base/redis.log" 2>&1 &
	pids+=($!)
	redis_url=redis://127.0.0.1:16580/0
	sleep 0.5
fi

# round FEEDS: one dispatcher (fresh data), one noop worker, the bench.
round() {
	local feeds=$1 data=$base/data-$RANDOM
	mkdir -p "$data"
	"$bin/dispatcher" --embedded --admission off --console=false --feeds="$feeds" --data-dir "$data" \
		--redis-url "" >"$data/dispatcher.log" 2>&1 &
	local dpid=$!
	for _ in $(seq 150); do
		code=0
		"$bin/fleetctl" status not-a-job >/dev/null 2>&1 || code=$?
		[ "$code" = 3 ] && break
		sleep 0.1
	done
	"$bin/worker" --executor noop --slots "$slots" --id bench-noop --data-dir "$workdir" --redis-url "$redis_url" \
		>"$data/worker.log" 2>&1 &
	local wpid=$!
	sleep 1
	local out tput cpu
	out=$("$bin/fleetctl" bench --jobs "$jobs" --pids "$dpid,$wpid")
	tput=$(awk '/^throughput:/ {print $2}' <<<"$out")
	cpu=$(awk '/^fleet CPU per job:/ {print $5}' <<<"$out")
	kill -TERM "$wpid" "$dpid"
	wait "$wpid" 2>/dev/null || true
	wait "$dpid" 2>/dev/null || true
	printf 'feeds=%-5s %10s jobs/s %8s µs CPU/job\n' "$feeds" "$tput" "$cpu"
	echo "$feeds $tput $cpu" >>"$base/results"
}

echo "machine: $(nproc) cores, $(go version | cut -d' ' -f3); $jobs no-op jobs per run, one worker with $slots slots, ${redis_url:+leases in redis-server}"
for _ in $(seq "$rounds"); do
	round true
	round false
done
for f in true false; do
	awk -v f="$f" '$1 == f {print $2}' "$base/results" | sort -n | awk -v f="$f" '{v[NR] = $1} END {
		printf "feeds=%s median %.0f jobs/s (%.0f to %.0f)\n", f, (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1], v[NR] }'
done | tee "$base/medians"
awk '{ m[$1] = $3 } END { printf "feeds on / off: %.2f\n", m["feeds=true"] / m["feeds=false"] }' "$base/medians"
