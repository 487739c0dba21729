#!/usr/bin/env bash
# The failover targets of the one-result work, run after run: the chaos
# test (three servers of a cluster SIGKILLed 12 s apart, on each submit
# path) and the failover test (4.5 s apart, each back 2 s later), each held
# to its latency and throughput targets (FLEET_FAILOVER_TARGETS). Prints
# each run's figures and how many runs met them. RUNS=3 by default.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
met=0
for i in $(seq "$runs"); do
	printf '\n== run %d of %d\n' "$i" "$runs"
	out=$(FLEET_FAILOVER_TARGETS=1 go test -count=1 -v -timeout 20m \
		-run '^(TestChaosOnACluster|TestFailoverCostsOnlyTheElections)$' ./internal/e2e/failover/ 2>&1)
	rc=$?
	grep -E 'undisturbed:|nodes killed, |beyond the elections: p50|target missed|^(--- |ok|FAIL)' <<<"$out" | sed 's/^ *//'
	((rc == 0)) && met=$((met + 1))
done
printf '\n== %d of %d runs met every target\n' "$met" "$runs"
