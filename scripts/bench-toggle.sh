#!/usr/bin/env bash
# make bench-console, make bench-feed: what a dispatcher's feature costs.
# The no-op throughput test of scripts/bench.sh, side by side in one run:
# a dispatcher with the feature on and the same with it off, alternating
# ROUNDS times; then each setting's median and their ratio.
#
#   scripts/bench-toggle.sh console   --console, with two console pages open
#                                     (the overview and the jobs list, each
#                                     a live stream at one update a second)
#   scripts/bench-toggle.sh feeds     --feeds: each job's final version
#                                     copied into FLEET_FEED_<tenant>;
#                                     and a third setting, "consumer",
#                                     with a consumer following the feed
#                                     meanwhile on the same machine
#                                     (fleetctl events --follow), each
#                                     entry acknowledged
#
# JOBS and SLOTS override the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."

feature=${1:?usage: $0 console|feeds}
case $feature in console | feeds) ;; *) echo "$0: no feature $feature" >&2; exit 2 ;; esac
bin=./bin
jobs=${JOBS:-20000}
slots=${SLOTS:-256}
rounds=${ROUNDS:-5}
base=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-$feature.XXXXXX")
export FLEET_NATS_URL=nats://127.0.0.1:14422
export FLEET_HTTP_ADDR=127.0.0.1:18280
export FLEET_LOG_LEVEL=warn
workdir=$base/work
[ -d /dev/shm ] && workdir=$(mktemp -d /dev/shm/fleet-bench-$feature.XXXXXX)

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

# round SETTING: one dispatcher (fresh data) with the feature on (true, or
# consumer) or off (false), one noop worker, the bench.
round() {
	local on=$1 data=$base/data-$RANDOM
	mkdir -p "$data"
	local flags=(--console="$on")
	[ "$feature" = feeds ] && flags=(--console=false --feeds="${on/consumer/true}")
	"$bin/dispatcher" --embedded --admission off "${flags[@]}" --data-dir "$data" \
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
	if [ "$feature" = console ] && [ "$on" = true ]; then
		for page in overview jobs; do
			curl -sN "http://$FLEET_HTTP_ADDR/ui/stream?page=$page&every=1s" >"$data/stream-$page" &
			viewers+=($!)
		done
		sleep 0.5
	fi
	if [ "$on" = consumer ]; then
		"$bin/fleetctl" events --follow --consumer bench -o json >"$data/feed" 2>"$data/feed.err" &
		viewers+=($!)
	fi
	local out tput cpu
	out=$("$bin/fleetctl" bench --jobs "$jobs" --pids "$dpid,$wpid")
	tput=$(awk '/^throughput:/ {print $2}' <<<"$out")
	cpu=$(awk '/^fleet CPU per job:/ {print $5}' <<<"$out")
	local extra="" ticks=0
	if [ "$on" = consumer ]; then
		# The consumer's own CPU (utime + stime, in clock ticks), before it ends.
		ticks=$(awk '{print $14 + $15}' "/proc/${viewers[0]}/stat" 2>/dev/null || echo 0)
	fi
	if [ ${#viewers[@]} -gt 0 ]; then
		for v in "${viewers[@]}"; do kill "$v" 2>/dev/null || true; done
		case $feature in
		console) extra="$(cat "$data"/stream-* | grep -c '^event: page' || true) page updates sent" ;;
		feeds)
			local read
			read=$(wc -l <"$data/feed")
			extra="$read feed entries read and acknowledged meanwhile, by a consumer of $(awk -v t="$ticks" -v n="$read" -v hz="$(getconf CLK_TCK)" \
				'BEGIN { printf "%.0f", n ? t / hz * 1e6 / n : 0 }') µs CPU/entry"
			;;
		esac
	fi
	kill -TERM "$wpid" "$dpid"
	wait "$wpid" 2>/dev/null || true
	wait "$dpid" 2>/dev/null || true
	printf '%s=%-5s %10s jobs/s %8s µs CPU/job %s\n' "$feature" "$on" "$tput" "$cpu" "$extra"
	echo "$on $tput" >>"$base/results"
}

echo "machine: $(nproc) cores, $(go version | cut -d' ' -f3); $jobs no-op jobs per run, one worker with $slots slots, ${redis_url:+leases in redis-server}"
settings=(true false)
[ "$feature" = feeds ] && settings=(true consumer false)
for _ in $(seq "$rounds"); do
	for on in "${settings[@]}"; do
		round "$on"
	done
done
for on in "${settings[@]}"; do
	awk -v on="$on" '$1 == on {print $2}' "$base/results" | sort -n | awk -v f="$feature=$on" '{v[NR] = $1} END {
		printf "%s median %.0f jobs/s (%.0f to %.0f)\n", f, (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1], v[NR] }'
done | tee "$base/medians"
awk -v f="$feature" '{ split($1, k, "="); m[k[2]] = $3 } END {
	printf "%s on / off: %.2f\n", f, m["true"] / m["false"]
	if ("consumer" in m) printf "%s on, with a consumer on the same machine / off: %.2f\n", f, m["consumer"] / m["false"] }' "$base/medians"
