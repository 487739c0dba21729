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
#   2b. Runs, on the same single-server fleet: a run of 10,000 nodes (one,
#      then 9,998 after it, then one after them all), the same graph through
#      a planner outside the fleet that submits each node when it hears its
#      parents' final versions (bench/runs), and 10,000 independent jobs,
#      the rate the run is held to; then a chain of 500 on an idle pool,
#      from a parent's end to its child's start, as a run and through the
#      planner.
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
(cd bench/runs && go build -o "../../$bin/runs-bench" .)
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

# fleet_up [dispatcher flags...]: the fleet on a fresh nats-server (its
# store emptied, as the loop makes its streams afresh each round): sets
# npid, dpid and wpid. fleet_down stops it.
export FLEET_NATS_URL=nats://127.0.0.1:14322
fleet_up() {
	rm -rf "$base/n0" "$base/dispatcher"
	nats n0 14322 0
	sleep 0.3
	dispatcher "$@"
	worker noop
}
fleet_down() { stop "$wpid" "$dpid" "$npid"; }

# The CPU a run cost the machine, per job: for the fleet its processes,
# redis-server's and fleetctl bench's own (the producer and the reader);
# for the loop, its process (producer, worker, reader), nats-server's and
# redis-server's; for asynq, its process and redis-server's.
allcpu() { python3 -c 'import json,sys; r=json.load(sys.stdin); print(r.get("cpu_per_job_us", 0) + r.get("self_cpu_per_job_us", 0))'; }
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
lowest() { sort -g | head -1; }

say "one NATS server: $jobs no-op jobs as fast as possible, $rounds rounds, each beside the console off, asynq and the loop"
printf '%-6s %10s %8s %11s %7s %10s %8s %8s %10s %8s %8s %8s\n' round "fleet j/s" "CPU µs" "console off" "on/off" "asynq t/s" "CPU µs" "f/asynq" \
	"loop j/s" "CPU µs" "f/loop" "CPU f/l"
onoff=() vsasynq=() vsloop=() cpuratio=() singles=()
for r in $(seq "$rounds"); do
	fleet_up
	f=$(bench --jobs "$jobs" --pids "$npid,$dpid,$wpid,$redis_pid")
	fleet_down
	fleet_up --console=false
	o=$(bench --jobs "$jobs" --pids "$npid,$dpid,$wpid,$redis_pid")
	fleet_down
	a=$("$bin/asynq-bench" --redis 127.0.0.1:16479 --tasks "$jobs" --concurrency "$slots" --pids "$redis_pid")
	nats n0 14322 0
	sleep 0.3
	l=$("$bin/jsloop-bench" --nats "$FLEET_NATS_URL" --redis redis://127.0.0.1:16479/2 --jobs "$jobs" --workers "$slots" --pids "$npid,$redis_pid")
	stop "$npid"
	fr=$(echo "$f" | field jobs_per_second) fc=$(echo "$f" | allcpu) or=$(echo "$o" | field jobs_per_second)
	ar=$(echo "$a" | field tasks_per_second) ac=$(echo "$a" | field cpu_per_task_us)
	lr=$(echo "$l" | field jobs_per_second) lc=$(echo "$l" | field cpu_per_job_us)
	singles+=("$fr") onoff+=("$(echo "$fr / $or" | bc -l)") vsasynq+=("$(echo "$fr / $ar" | bc -l)")
	vsloop+=("$(echo "$fr / $lr" | bc -l)") cpuratio+=("$(echo "$fc / $lc" | bc -l)")
	printf '%-6s %10.0f %8.0f %11.0f %6.2fx %10.0f %8.0f %7.2fx %10.0f %8.0f %7.2fx %7.2fx\n' "$r" "$fr" "$fc" "$or" "${onoff[-1]}" \
		"$ar" "$ac" "${vsasynq[-1]}" "$lr" "$lc" "${vsloop[-1]}" "${cpuratio[-1]}"
done
single=$(printf '%s\n' "${singles[@]}" | median)
printf 'medians of %d rounds: fleet / loop %sx (target 0.6x), CPU per job fleet / loop %sx (target at most 2x), console on / off %sx (target 0.95x); fleet / asynq at its lowest %.2fx (target above 1x in every round)\n' \
	"$rounds" "$(printf '%s\n' "${vsloop[@]}" | median)" "$(printf '%s\n' "${cpuratio[@]}" | median)" "$(printf '%s\n' "${onoff[@]}" | median)" \
	"$(printf '%s\n' "${vsasynq[@]}" | lowest)"

say "paced at 1,000 jobs/s, 5,000 jobs: the fleet's submit -> result beside the loop's publish -> result, $rounds rounds"
p50s=() p99s=()
for r in $(seq "$rounds"); do
	fleet_up
	f=$(bench --jobs 5000 --rate 1000 --pids "$npid,$dpid,$wpid,$redis_pid" --metrics "http://$metrics/metrics")
	fleet_down
	nats n0 14322 0
	sleep 0.3
	l=$("$bin/jsloop-bench" --nats "$FLEET_NATS_URL" --redis redis://127.0.0.1:16479/2 --jobs 5000 --rate 1000 --workers "$slots" --pids "$npid,$redis_pid")
	stop "$npid"
	f50=$(echo "$f" | field submit_to_result_p50_ms) f99=$(echo "$f" | field submit_to_result_p99_ms)
	l50=$(echo "$l" | field publish_to_result_p50_ms) l99=$(echo "$l" | field publish_to_result_p99_ms)
	p50s+=("$(echo "$f50 / $l50" | bc -l)") p99s+=("$(echo "$f99 / $l99" | bc -l)")
	printf 'round %s: fleet p50 %.2f ms, p99 %.2f ms, %.0f µs CPU/job, %.2f Redis round trips/job; the loop p50 %.2f ms, p99 %.2f ms; fleet / loop p50 %.2fx, p99 %.2fx\n' \
		"$r" "$f50" "$f99" "$(echo "$f" | allcpu)" "$(echo "$f" | field redis_calls_per_job)" "$l50" "$l99" "${p50s[-1]}" "${p99s[-1]}"
done
printf 'medians: fleet / loop p50 %sx (target at most 2.5x), p99 %sx (target at most 3x)\n' "$(printf '%s\n' "${p50s[@]}" | median)" "$(printf '%s\n' "${p99s[@]}" | median)"

nodes=${RUN_NODES:-10000} chain=${RUN_CHAIN:-500}
say "runs: $nodes nodes (1 -> $((nodes - 2)) -> 1) as one run, the same graph through a planner outside the fleet (bench/runs), and $nodes independent jobs; a chain of $chain on an idle pool, parent's end -> child's start; $rounds rounds"
printf '%-6s %10s %10s %10s %8s %8s %11s %11s %11s %11s\n' round "jobs n/s" "run n/s" "planner" "run/jobs" "pl/jobs" "run p50 ms" "run p99 ms" "plan p50" "plan p99"
runjobs=() planjobs=() rp50=() rp99=() pp50=() pp99=()
runs_bench() { "$bin/runs-bench" --nats "$FLEET_NATS_URL" "$@"; }
for r in $(seq "$rounds"); do
	fleet_up
	rj=$(runs_bench --via jobs --nodes "$nodes")
	fleet_down
	fleet_up
	rf=$(runs_bench --via run --shape fan --nodes "$nodes")
	fleet_down
	fleet_up
	rp=$(runs_bench --via planner --shape fan --nodes "$nodes")
	fleet_down
	fleet_up
	rc=$(runs_bench --via run --shape chain --nodes "$chain")
	rpc=$(runs_bench --via planner --shape chain --nodes "$chain")
	fleet_down
	jr=$(echo "$rj" | field nodes_per_second) fr=$(echo "$rf" | field nodes_per_second) pr=$(echo "$rp" | field nodes_per_second)
	runjobs+=("$(echo "$fr / $jr" | bc -l)") planjobs+=("$(echo "$pr / $jr" | bc -l)")
	rp50+=("$(echo "$rc" | field release_p50_ms)") rp99+=("$(echo "$rc" | field release_p99_ms)")
	pp50+=("$(echo "$rpc" | field release_p50_ms)") pp99+=("$(echo "$rpc" | field release_p99_ms)")
	printf '%-6s %10.0f %10.0f %10.0f %7.2fx %7.2fx %11.2f %11.2f %11.2f %11.2f\n' "$r" "$jr" "$fr" "$pr" "${runjobs[-1]}" "${planjobs[-1]}" \
		"${rp50[-1]}" "${rp99[-1]}" "${pp50[-1]}" "${pp99[-1]}"
done
printf 'medians: a run / independent jobs %sx (target 0.8x), the planner / independent jobs %sx; a parent'"'"'s end -> its child'"'"'s start in a run p50 %s ms (target under 5), p99 %s ms (target under 20), through the planner p50 %s ms, p99 %s ms\n' \
	"$(printf '%s\n' "${runjobs[@]}" | median)" "$(printf '%s\n' "${planjobs[@]}" | median)" "$(printf '%s\n' "${rp50[@]}" | median)" \
	"$(printf '%s\n' "${rp99[@]}" | median)" "$(printf '%s\n' "${pp50[@]}" | median)" "$(printf '%s\n' "${pp99[@]}" | median)"

say "fire and forget on fleet.t.default.intake (kept by the intake stream), $jobs no-op jobs"
fleet_up
bench --jobs "$jobs" --stored --pids "$npid,$dpid,$wpid,$redis_pid" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.0f jobs/s, %.0f µs of CPU per job" % (r["jobs_per_second"], r.get("cpu_per_job_us", 0) + r.get("self_cpu_per_job_us", 0)))'
fleet_down

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
clusters=()
for r in $(seq "$rounds"); do
	f=$(bench --jobs "$jobs" --pids "$c1,$c2,$c3,$dpid,$wpid,$redis_pid")
	clusters+=("$(echo "$f" | field jobs_per_second)")
	printf 'round %s: %.0f jobs/s, %.0f µs of CPU per job\n' "$r" "${clusters[-1]}" "$(echo "$f" | allcpu)"
done
printf 'the cluster / the single server, medians: %.2fx (target 0.6x)\n' "$(echo "$(printf '%s\n' "${clusters[@]}" | median) / $single" | bc -l)"

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
