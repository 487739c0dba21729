#!/usr/bin/env bash
# make bench, sharing a pool (docs/sharing.md): what the queues per tenant
# and priority cost, side by side in one run with the fleet of before them.
#
#   base    the fleet at BASE (default: the last commit before sharing),
#           built here, one FIFO consumer per pool
#   one     this fleet, one tenant at one priority
#   ten     this fleet, 10 tenants of weights 1 to 10 (fleetctl bench
#           --tenants 10: bench-t0 ... bench-t9, in turn)
#
# Each: a nats-server process with file storage, a redis-server, a
# dispatcher with admission, one noop worker with 64 slots, all started
# afresh; JOBS no-op jobs as fast as possible, ROUNDS rounds alternating;
# then 5,000 jobs paced at 1,000/s for the submit -> start latency.
set -euo pipefail
cd "$(dirname "$0")/.."

base_ref=${BASE:-3e2fbf7}
jobs=${JOBS:-5000}
rounds=${ROUNDS:-3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-sharing.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

[ -x bin/nats-server ] || go build -o bin/nats-server github.com/nats-io/nats-server/v2
git worktree add --detach "$tmp/base" "$base_ref" >/dev/null 2>&1
(cd "$tmp/base" && go build -o "$tmp/base-bin/" ./cmd/dispatcher ./cmd/worker ./cmd/fleetctl)
new=./bin

export FLEET_LOG_LEVEL=warn FLEET_NATS_URL=nats://127.0.0.1:14422 FLEET_REDIS_URL=redis://127.0.0.1:16579/0 \
	FLEET_HTTP_ADDR=127.0.0.1:18280

# run BIN TENANTS [bench flags...]: a fresh fleet of BIN, the bench as JSON.
run() {
	local bin=$1 tenants=$2 d
	shift 2
	d=$(mktemp -d "$tmp/run.XXXXXX")
	redis-server --bind 127.0.0.1 --port 16579 --save '' --appendonly no >"$d/redis.log" 2>&1 &
	local rp=$!
	printf 'listen: 127.0.0.1:14422\njetstream { store_dir: "%s/js" }\n' "$d" >"$d/nats.conf"
	bin/nats-server -c "$d/nats.conf" >"$d/nats.log" 2>&1 &
	local np=$!
	pids+=("$rp" "$np")
	sleep 0.5
	"$bin/dispatcher" --data-dir "$d/dispatcher" --v1=false >"$d/dispatcher.log" 2>&1 &
	local dp=$!
	pids+=("$dp")
	for _ in $(seq 300); do
		c=0
		"$bin/fleetctl" status not-a-job >/dev/null 2>&1 || c=$?
		[ "$c" = 3 ] && break
		sleep 0.1
	done
	"$bin/worker" --executor noop --slots 64 --id bench-sharing --data-dir "$d/worker" >"$d/worker.log" 2>&1 &
	local wp=$!
	pids+=("$wp")
	for _ in $(seq 100); do
		"$bin/fleetctl" workers 2>/dev/null | grep -q bench-sharing && break
		sleep 0.1
	done
	local extra=()
	if [ "$tenants" -gt 1 ]; then
		local weights=()
		for t in $(seq 0 $((tenants - 1))); do weights+=(--weight "bench-t$t=$((t + 1))"); done
		"$bin/fleetctl" pool set default "${weights[@]}" >/dev/null
		extra=(--tenants "$tenants")
	fi
	"$bin/fleetctl" bench -o json --pids "$np,$dp,$wp" "${extra[@]}" "$@" 2>>"$tmp/bench.err"
	for p in "$wp" "$dp" "$np" "$rp"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
	rm -rf "$d"
}

field() { python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"; }

printf '\n== sharing a pool: %d no-op jobs as fast as possible, %d rounds (base: %s)\n' "$jobs" "$rounds" "$(git rev-parse --short "$base_ref")"
printf '%-6s %12s %10s %12s %10s %8s %12s %10s %8s\n' round "base jobs/s" "CPU µs" "one jobs/s" "CPU µs" "/ base" "ten jobs/s" "CPU µs" "/ base"
one_r=() ten_r=()
for r in $(seq "$rounds"); do
	b=$(run "$tmp/base-bin" 1 --jobs "$jobs")
	o=$(run "$new" 1 --jobs "$jobs")
	t=$(run "$new" 10 --jobs "$jobs")
	br=$(echo "$b" | field jobs_per_second) or=$(echo "$o" | field jobs_per_second) tr=$(echo "$t" | field jobs_per_second)
	one_r+=("$(echo "$or / $br" | bc -l)") ten_r+=("$(echo "$tr / $br" | bc -l)")
	printf '%-6s %12.0f %10.0f %12.0f %10.0f %7.2fx %12.0f %10.0f %7.2fx\n' "$r" \
		"$br" "$(echo "$b" | field cpu_per_job_us)" "$or" "$(echo "$o" | field cpu_per_job_us)" "${one_r[-1]}" \
		"$tr" "$(echo "$t" | field cpu_per_job_us)" "${ten_r[-1]}"
done
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "medians: one tenant $(printf '%s\n' "${one_r[@]}" | median)x the base (target >= 0.9x), ten tenants $(printf '%s\n' "${ten_r[@]}" | median)x (target >= 0.8x)"

printf '\n== paced at 1,000 jobs/s, 5,000 jobs: submit -> start\n'
for v in "base $tmp/base-bin 1" "one $new 1" "ten $new 10"; do
	set -- $v
	out=$(run "$2" "$3" --jobs 5000 --rate 1000)
	printf '%-5s p50 %6.2f ms   p99 %6.2f ms\n' "$1" "$(echo "$out" | field submit_to_start_p50_ms)" "$(echo "$out" | field submit_to_start_p99_ms)"
done
