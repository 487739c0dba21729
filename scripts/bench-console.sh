#!/usr/bin/env bash
# make bench-console: what an open console costs the dispatcher. Runs the
# no-op throughput test of scripts/bench.sh side by side, in one run:
# a dispatcher with the console on and two console pages open (the
# overview and the jobs list, each a live stream at one update a second),
# and the same dispatcher with --console=false, alternating ROUNDS times.
# JOBS and SLOTS override the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=./bin
jobs=${JOBS:-20000}
slots=${SLOTS:-256}
rounds=${ROUNDS:-3}
base=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-console.XXXXXX")
export FLEET_NATS_URL=nats://127.0.0.1:14422
export FLEET_HTTP_ADDR=127.0.0.1:18280
export FLEET_LOG_LEVEL=warn
workdir=$base/work
[ -d /dev/shm ] && workdir=$(mktemp -d /dev/shm/fleet-bench-console.XXXXXX)

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$base" "$workdir"
}
trap cleanup EXIT

# Leases go to a real redis-server when one is installed, as in
# scripts/bench.sh; the embedded dispatcher then runs without Redis (with
# --embedded, --redis-url would start its own store there).
redis_url=""
if command -v redis-server >/dev/null; then
	redis-server --bind 127.0.0.1 --port 16579 --save '' --appendonly no >"$base/redis.log" 2>&1 &
	pids+=($!)
	redis_url=redis://127.0.0.1:16579/0
	sleep 0.5
fi

# round CONSOLE: one dispatcher (fresh data), one noop worker, the bench.
round() {
	local console=$1 data=$base/data-$RANDOM
	mkdir -p "$data"
	"$bin/dispatcher" --embedded --admission off --console="$console" --data-dir "$data" \
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
	local viewers=()
	if [ "$console" = true ]; then
		for page in overview jobs; do
			curl -sN "http://$FLEET_HTTP_ADDR/ui/stream?page=$page&every=1s" >"$data/stream-$page" &
			viewers+=($!)
		done
		sleep 0.5
	fi
	local out
	out=$("$bin/fleetctl" bench --jobs "$jobs" --pids "$dpid,$wpid")
	local tput cpu
	tput=$(awk '/^throughput:/ {print $2}' <<<"$out")
	cpu=$(awk '/^fleet CPU per job:/ {print $5}' <<<"$out")
	local pushed=0
	if [ "$console" = true ]; then
		for v in "${viewers[@]}"; do kill "$v" 2>/dev/null || true; done
		pushed=$(cat "$data"/stream-* | grep -c '^event: page' || true)
	fi
	kill -TERM "$wpid" "$dpid"
	wait "$wpid" 2>/dev/null || true
	wait "$dpid" 2>/dev/null || true
	printf '%-8s %10s jobs/s %8s µs CPU/job %6s page updates sent\n' "console=$console" "$tput" "$cpu" "$pushed"
	echo "$console $tput" >>"$base/results"
}

echo "machine: $(nproc) cores, $(go version | cut -d' ' -f3); $jobs no-op jobs per run, one worker with $slots slots, ${redis_url:+leases in redis-server}"
for _ in $(seq "$rounds"); do
	round true
	round false
done
awk '{ sum[$1] += $2; n[$1]++ } END {
	on = sum["true"] / n["true"]; off = sum["false"] / n["false"];
	printf "mean: console on %.0f jobs/s, off %.0f jobs/s: the console costs %.1f%%\n", on, off, 100 * (off - on) / off }' "$base/results"
