#!/usr/bin/env bash
# make bench: the load test through the whole fleet, set up as a user
# deploys it, beside asynq and the bare JetStream loop on the same machine
# in the same run.
#
#   1. Production-like, one NATS server: a separate nats-server process with
#      file storage, a redis-server, a dispatcher (admission on, the console
#      on, contract v1 off as in the production profiles), one noop worker
#      with 64 slots. JOBS no-op jobs submitted on fleet.t.default.submit as
#      fast as possible, results read on fleet.t.default.job.*.r.>; then the
#      same on fleet.t.default.intake (fire and forget, kept by the intake
#      stream); then jobs paced at 1,000/s, for latency.
#      Each ROUNDS times, alternating with
#   2. asynq v0.26 enqueuing and processing the same number of no-op tasks
#      on the same redis-server, with 64 workers (bench/asynq), and the
#      bare JetStream loop, the fleet's lower bound, on the same nats-server
#      and redis-server in streams of its own (bench/jsloop): jobs published
#      to a work-queue stream, pulled in batches of up to 64 for 64 slots, a
#      Redis Lua slot lease per job, the result published asynchronously,
#      the ack.
#   3. The same fleet on a three-node NATS cluster with streams of three
#      replicas, no-op jobs as fast as possible, and jobs spread over three
#      pools.
#   4. The process executor running `true`, and, with Docker, a fleet job
#      against the bare Docker API cycle of the same image.
#
# CPU per job is the CPU time the fleet's processes (NATS servers,
# dispatcher, worker) spent, per job, not fleetctl bench's nor
# redis-server's; for asynq, its process and redis-server's; for the loop,
# its process (producer, worker and reader), nats-server's and
# redis-server's.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=./bin
jobs=${JOBS:-5000}
rounds=${ROUNDS:-3}
slots=${SLOTS:-64}
base=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench.XXXXXX")
export FLEET_LOG_LEVEL=warn
export FLEET_HTTP_ADDR=127.0.0.1:18180
metrics=127.0.0.1:18181

# Workspaces of the process executor go to tmpfs when there is one: on this
# kind of disk a directory costs ~150 µs to make and as much to remove,
# which would measure the disk, not the fleet (JetStream's files stay on
# the disk).
workdir=$base/work
[ -d /dev/shm ] && workdir=$(mktemp -d /dev/shm/fleet-bench.XXXXXX)

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$base" "$workdir"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }

# The NATS server the fleet requires, and the peers, built once.
go build -o "$bin/nats-server" github.com/nats-io/nats-server/v2
(cd bench/asynq && go build -o "../../$bin/asynq-bench" .)
(cd bench/jsloop && go build -o "../../$bin/jsloop-bench" .)
command -v redis-server >/dev/null || { echo "make bench needs redis-server"; exit 1; }

redis-server --bind 127.0.0.1 --port 16479 --save '' --appendonly no >"$base/redis.log" 2>&1 &
redis_pid=$!
pids+=($redis_pid)
export FLEET_REDIS_URL=redis://127.0.0.1:16479/0
sleep 0.5

# nats NAME PORT CLUSTER_PORT [ROUTES]: a nats-server process with file
# storage; sets npid.
nats() {
	local name=$1 port=$2 cport=$3 routes=${4:-}
	mkdir -p "$base/$name"
	{
		echo "server_name: $name"
		echo "listen: 127.0.0.1:$port"
		echo "max_payload: 8MB"
		echo "jetstream { store_dir: \"$base/$name\" }"
		if [ -n "$routes" ]; then
			echo "cluster { name: bench, listen: 127.0.0.1:$cport, routes: [$routes] }"
		fi
	} >"$base/$name.conf"
	"$bin/nats-server" -c "$base/$name.conf" >"$base/$name.log" 2>&1 &
	npid=$!
	pids+=($npid)
}

# dispatcher [flags...]: sets dpid, waits until it answers.
dispatcher() {
	"$bin/dispatcher" --data-dir "$base/dispatcher" --v1=false "$@" >>"$base/dispatcher.log" 2>&1 &
	dpid=$!
	pids+=($dpid)
	for _ in $(seq 300); do
		code=0
		"$bin/fleetctl" status not-a-job >/dev/null 2>&1 || code=$?
		[ "$code" = 3 ] && return
		sleep 0.1
	done
	echo "the dispatcher did not start:"; tail -20 "$base/dispatcher.log"; exit 1
}

# worker EXECUTOR [flags...]: sets wpid, waits for its first heartbeat.
worker() {
	local executor=$1
	shift
	"$bin/worker" --executor "$executor" --slots "$slots" --id "bench-$executor" --metrics-addr "$metrics" \
		--data-dir "$workdir" "$@" >>"$base/worker.log" 2>&1 &
	wpid=$!
	pids+=($wpid)
	for _ in $(seq 100); do
		"$bin/fleetctl" workers 2>/dev/null | grep -q "bench-$executor" && return
		sleep 0.1
	done
}

stop() { for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

# bench ARGS...: fleetctl bench, its report as JSON.
bench() { "$bin/fleetctl" bench -o json "$@"; }

field() { python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"; }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(go version | cut -d' ' -f3), $(redis-server --version | grep -o 'v=[0-9.]*' | cut -c3-) redis-server"
echo "the fleet: nats-server $("$bin/nats-server" --version | grep -o "v[0-9][0-9.]*" | head -1) (file storage, a process of its own), a dispatcher (admission reject, console on), one noop worker with $slots slots"
echo "the peer:  asynq v0.26, $slots concurrent handlers, on the same redis-server"
echo "the loop:  bare JetStream (bench/jsloop), $slots slots, on the same nats-server and redis-server"

say "one NATS server: $jobs no-op jobs as fast as possible, $rounds rounds, each beside asynq and the loop"
export FLEET_NATS_URL=nats://127.0.0.1:14322
nats n0 14322 0
sleep 0.3
dispatcher
worker noop
printf '%-8s %12s %12s %14s %12s %14s %12s %12s %13s\n' round "fleet jobs/s" "CPU/job µs" "asynq tasks/s" "CPU/task µs" "fleet / asynq" \
	"loop jobs/s" "CPU/job µs" "fleet / loop"
fleet_rates=() asynq_rates=() loop_ratios=()
for r in $(seq "$rounds"); do
	f=$(bench --jobs "$jobs" --pids "$npid,$dpid,$wpid")
	a=$("$bin/asynq-bench" --redis 127.0.0.1:16479 --tasks "$jobs" --concurrency "$slots" --pids "$redis_pid")
	l=$("$bin/jsloop-bench" --nats "$FLEET_NATS_URL" --redis redis://127.0.0.1:16479/2 --jobs "$jobs" --workers "$slots" --pids "$npid,$redis_pid")
	fr=$(echo "$f" | field jobs_per_second) fc=$(echo "$f" | field cpu_per_job_us)
	ar=$(echo "$a" | field tasks_per_second) ac=$(echo "$a" | field cpu_per_task_us)
	lr=$(echo "$l" | field jobs_per_second) lc=$(echo "$l" | field cpu_per_job_us)
	fleet_rates+=("$fr") asynq_rates+=("$ar") loop_ratios+=("$(echo "$fr / $lr" | bc -l)")
	printf '%-8s %12.0f %12.0f %14.0f %12.0f %13.2fx %12.0f %12.0f %12.2fx\n' "$r" "$fr" "$fc" "$ar" "$ac" "$(echo "$fr / $ar" | bc -l)" \
		"$lr" "$lc" "${loop_ratios[-1]}"
done
printf '%s\n' "${loop_ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END {
	printf "fleet / loop, the median of %d rounds: %.2fx\n", NR, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
}'

say "the same, fire and forget on fleet.t.default.intake (kept by the intake stream)"
bench --jobs "$jobs" --stored --pids "$npid,$dpid,$wpid" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.0f jobs/s, %.0f µs of CPU per job" % (r["jobs_per_second"], r.get("cpu_per_job_us", 0)))'

say "paced at 1,000 jobs/s, 5,000 jobs: latency"
"$bin/fleetctl" bench --jobs 5000 --rate 1000 --pids "$npid,$dpid,$wpid" --metrics "http://$metrics/metrics"
stop "$wpid" "$dpid" "$npid"

say "a three-node NATS cluster, streams of three replicas: $jobs no-op jobs as fast as possible"
export FLEET_NATS_URL=nats://127.0.0.1:14331,nats://127.0.0.1:14332,nats://127.0.0.1:14333
routes="nats://127.0.0.1:14341,nats://127.0.0.1:14342,nats://127.0.0.1:14343"
nats c1 14331 14341 "$routes"
c1=$npid
nats c2 14332 14342 "$routes"
c2=$npid
nats c3 14333 14343 "$routes"
c3=$npid
sleep 2
dispatcher --replicas 3
worker noop
for r in $(seq "$rounds"); do
	f=$(bench --jobs "$jobs" --pids "$c1,$c2,$c3,$dpid,$wpid")
	printf 'round %s: %.0f jobs/s, %.0f µs of CPU per job\n' "$r" "$(echo "$f" | field jobs_per_second)" "$(echo "$f" | field cpu_per_job_us)"
done

say "the same cluster, paced at 1,000 jobs/s, 5,000 jobs: latency"
"$bin/fleetctl" bench --jobs 5000 --rate 1000 --pids "$c1,$c2,$c3,$dpid,$wpid"
stop "$wpid"

say "the same cluster, $jobs no-op jobs spread over three pools (a stream each), one worker each"
pool_workers=()
for p in red green blue; do
	"$bin/worker" --executor noop --slots "$slots" --id "bench-$p" --pool "$p" --data-dir "$workdir/$p" >>"$base/worker.log" 2>&1 &
	pool_workers+=($!) pids+=($!)
done
for _ in $(seq 100); do
	[ "$("$bin/fleetctl" workers 2>/dev/null | grep -c 'bench-\(red\|green\|blue\)')" = 3 ] && break
	sleep 0.1
done
per=$((jobs / 3)) benches=()
begin=$(date +%s.%N)
for p in red green blue; do
	bench --jobs "$per" --pool "$p" >"$base/pool-$p.json" &
	benches+=($!)
done
for b in "${benches[@]}"; do wait "$b"; done
end=$(date +%s.%N)
printf '%d jobs in %.2f s: %.0f jobs/s\n' $((per * 3)) "$(echo "$end - $begin" | bc -l)" "$(echo "$per * 3 / ($end - $begin)" | bc -l)"
stop "${pool_workers[@]}"

say "process executor running true, $jobs jobs as fast as possible (one NATS server)"
stop "$dpid" "$c1" "$c2" "$c3"
export FLEET_NATS_URL=nats://127.0.0.1:14322
rm -rf "$base/n0" "$base/dispatcher"
nats n0 14322 0
sleep 0.3
dispatcher
worker process
"$bin/fleetctl" bench --jobs "$jobs" --command true --pids "$npid,$dpid,$wpid"
stop "$wpid"

if docker info >/dev/null 2>&1; then
	n=${DOCKER_JOBS:-20}
	say "docker: true in fleet-test/testprog, $n one at a time, against the bare Docker API cycle"
	bare=$(go test -run '^$' -bench 'BareDockerCycle' -benchtime "${n}x" ./internal/executor/docker/ | awk '/^Benchmark/ {print $3}')
	slots=1 worker docker
	f=$(bench --jobs "$n" --image fleet-test/testprog:latest --command true)
	awk -v bare="$bare" -v secs="$(echo "$f" | field seconds)" -v n="$n" 'BEGIN {
		fleet = secs * 1000 / n; raw = bare / 1e6
		printf "fleet: %.0f ms per job; the bare Docker API cycle: %.0f ms; fleet / bare: %.2fx\n", fleet, raw, fleet / raw
	}'
fi
