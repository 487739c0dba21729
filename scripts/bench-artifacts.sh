#!/usr/bin/env bash
# make bench, artifacts and whole logs (under a minute):
#   1. output upload: an output stored from an attempt's workspace against
#      the object store client's own Put of the same file, in the same run
#      (BenchmarkOutputUpload; target: the output at least 0.9x the Put);
#   2. no-op jobs through the whole fleet with log archiving on and off
#      (worker --archive-logs), alternating, ROUNDS times each, after a run
#      not counted; then the
#      process executor running `echo`, whose one line per attempt is
#      archived (a chunk and the log's description stored per job).
# JOBS, PROCESS_JOBS, ROUNDS and UPLOAD_MIB override the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=./bin
jobs=${JOBS:-5000}
pjobs=${PROCESS_JOBS:-1000}
rounds=${ROUNDS:-3}
slots=${SLOTS:-64}
upload=${UPLOAD_MIB:-64}
data=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-artifacts.XXXXXX")
export FLEET_NATS_URL=nats://127.0.0.1:14342
export FLEET_REDIS_URL=redis://127.0.0.1:16499/0
export FLEET_HTTP_ADDR=127.0.0.1:18290
export FLEET_DATA_DIR=$data
export FLEET_LOG_LEVEL=warn

workdir=$data/worker
[ -d /dev/shm ] && workdir=$(mktemp -d /dev/shm/fleet-bench-artifacts.XXXXXX)

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$data" "$workdir"
}
trap cleanup EXIT

echo "== output upload: ${upload} MiB of random bytes, stored as an output vs a raw Object Store Put, 3 times each"
FLEET_BENCH_UPLOAD_MIB=$upload go test -run '^$' -bench '^BenchmarkOutputUpload$' -benchtime 3x ./internal/artifact/ |
	awk '/^BenchmarkOutputUpload/ {
		for (i = 1; i <= NF; i++) { if ($(i+1) == "raw-MiB/s") raw = $i; if ($(i+1) == "output-MiB/s") out = $i; if ($(i+1) == "ratio") r = $i }
		printf "raw Put: %.0f MiB/s   output: %.0f MiB/s   ratio: %.2f (target >= 0.9)\n", raw, out, r }'

"$bin/dispatcher" --embedded --admission off >"$data/dispatcher.log" 2>&1 &
dpid=$!
pids+=($dpid)
for _ in $(seq 150); do
	code=0
	"$bin/fleetctl" status not-a-job >/dev/null 2>&1 || code=$?
	[ "$code" = 3 ] && break
	sleep 0.1
done

# run EXECUTOR ARCHIVE JOBS [bench flags...]: one worker, one bench; prints
# the rate in jobs/s.
run() {
	local executor=$1 archive=$2 n=$3
	shift 3
	"$bin/worker" --executor "$executor" --slots "$slots" --id "bench-art-$executor" --redis-url "" \
		--data-dir "$workdir" --archive-logs="$archive" >>"$data/worker.log" 2>&1 &
	local wpid=$!
	pids+=($wpid)
	sleep 1
	"$bin/fleetctl" bench --jobs "$n" "$@" 2>/dev/null | awk '/^throughput:/ {print $2}'
	kill -TERM "$wpid"
	wait "$wpid" 2>/dev/null || true
}

# compare EXECUTOR JOBS [bench flags...]: archiving on and off, alternating.
compare() {
	local executor=$1 n=$2
	shift 2
	local on=() off=()
	for r in $(seq "$rounds"); do
		if [ $((r % 2)) = 1 ]; then
			on+=("$(run "$executor" true "$n" "$@")")
			off+=("$(run "$executor" false "$n" "$@")")
		else
			off+=("$(run "$executor" false "$n" "$@")")
			on+=("$(run "$executor" true "$n" "$@")")
		fi
	done
	python3 - "${on[*]}" "${off[*]}" <<'EOF'
import sys
on = [float(x) for x in sys.argv[1].split()]
off = [float(x) for x in sys.argv[2].split()]
mean = lambda v: sum(v) / len(v)
print("archiving on:  %s jobs/s (mean %.0f)" % (" ".join("%.0f" % x for x in on), mean(on)))
print("archiving off: %s jobs/s (mean %.0f)" % (" ".join("%.0f" % x for x in off), mean(off)))
print("ratio on/off:  %.2f (target >= 0.9)" % (mean(on) / mean(off)))
EOF
}

# A first run, not counted, warms the streams and the page cache.
run noop true "$jobs" >/dev/null
echo; echo "== noop executor, $jobs jobs as fast as possible, log archiving on vs off, $rounds rounds"
compare noop "$jobs"
echo; echo "== process executor running echo (one line archived per job), $pjobs jobs, on vs off, $rounds rounds"
compare process "$pjobs" --command "echo fleet-bench"
