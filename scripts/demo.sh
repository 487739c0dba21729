#!/usr/bin/env bash
# make demo: a whole fleet on this machine, with nothing installed but Go.
# Starts `dispatcher --embedded` (NATS with JetStream and a Redis-protocol
# store inside it) and one worker, submits the jobs in examples/, shows their
# events live, prints a summary, and stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${FLEET_DEMO_BIN:-./bin}
data=$(mktemp -d "${TMPDIR:-/tmp}/fleet-demo.XXXXXX")
# Ports away from the defaults, so the demo runs beside a real fleet.
export FLEET_NATS_URL=nats://127.0.0.1:14222
export FLEET_REDIS_URL=redis://127.0.0.1:16379/0
export FLEET_HTTP_ADDR=127.0.0.1:18080
export FLEET_DATA_DIR=$data

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$data"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "starting the dispatcher (embedded NATS + Redis-protocol store, data in $data)"
"$bin/dispatcher" --embedded --v1=false --log-format text >"$data/dispatcher.log" 2>&1 &
pids+=($!)
# Ready when fleetctl can reach it and finds no such job (exit code 3).
ready=0
for _ in $(seq 150); do
	code=0
	"$bin/fleetctl" status not-a-job >/dev/null 2>&1 || code=$?
	if [ "$code" = 3 ]; then ready=1; break; fi
	sleep 0.1
done
[ "$ready" = 1 ] || { echo "the dispatcher did not start:"; cat "$data/dispatcher.log"; exit 1; }
say "the console: http://$FLEET_HTTP_ADDR/ui/  (open while the demo runs; FLEET_DEMO_HOLD=1 keeps the fleet up after it)"

# The Docker executor when a daemon answers (the jobs' image is built
# locally: no registry needed), else the process executor. The examples run
# on both: they name an image, and write through $FLEET_OUTPUTS.
executor=process
if docker info >/dev/null 2>&1 && ./scripts/demo-image.sh >/dev/null 2>&1; then
	executor=docker
fi
say "starting a worker (--executor $executor, 4 slots)"
"$bin/worker" --executor "$executor" --pool default --slots 4 --id demo-worker --grace 1s \
	>"$data/worker.log" 2>&1 &
pids+=($!)
# Ready when its first heartbeat is in: fleetctl lists it.
ready=0
for _ in $(seq 150); do
	if "$bin/fleetctl" workers 2>/dev/null | grep -q '^demo-worker '; then ready=1; break; fi
	sleep 0.1
done
[ "$ready" = 1 ] || { echo "the worker did not start:"; cat "$data/worker.log"; exit 1; }

ids=()
for f in examples/*.json; do
	id=$(sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' "$f" | head -1)
	ids+=("$id")
	say "fleetctl submit -f $f --wait"
	"$bin/fleetctl" submit -f "$f" --wait || true
done

say "summary: fleetctl status ${ids[*]}"
summary=$("$bin/fleetctl" status "${ids[@]}")
echo "$summary"

if command -v curl >/dev/null; then
	say "the same over HTTP: curl http://$FLEET_HTTP_ADDR/v1/jobs/${ids[0]}"
	curl -fsS "http://$FLEET_HTTP_ADDR/v1/jobs/${ids[0]}" | head -12
	echo "  ..."
fi
# Each example ends as its name says; a demo that shows otherwise fails.
status=0
for want in demo-hello=succeeded demo-fails=failed demo-times-out=timed_out; do
	id=${want%=*} state=${want#*=}
	got=$(echo "$summary" | awk -v id="$id" '$1 == id { print $2 }')
	if [ "$got" != "$state" ]; then
		echo "demo: $id ended $got, want $state" >&2
		status=1
	fi
done
# The console shows the same jobs.
if command -v curl >/dev/null; then
	say "the console lists them: http://$FLEET_HTTP_ADDR/ui/jobs"
	page=$(curl -fsS "http://$FLEET_HTTP_ADDR/ui/jobs" || true)
	for id in "${ids[@]}"; do
		if grep -q "id=\"job-default.default.$id\"" <<<"$page"; then
			echo "  $id: $(grep -A3 "id=\"job-default.default.$id\"" <<<"$page" | grep -o 'data-state="[a-z_]*"' | head -1)"
		else
			echo "demo: $id is not on the console's jobs page" >&2
			status=1
		fi
	done
fi
[ "$status" = 0 ] || { echo "--- dispatcher log" >&2; tail -20 "$data/dispatcher.log" >&2;
	echo "--- worker log" >&2; tail -20 "$data/worker.log" >&2; }
if [ -n "${FLEET_DEMO_HOLD:-}" ]; then
	say "the fleet stays up: the console is at http://$FLEET_HTTP_ADDR/ui/ (Ctrl-C stops it)"
	wait "${pids[0]}" || true
fi
say "stopping"
exit "$status"
