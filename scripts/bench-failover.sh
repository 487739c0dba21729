#!/usr/bin/env bash
# The failover targets, run after run, each test beside its undisturbed
# baseline (FLEET_TARGETS; make test leaves the baselines out and asserts
# only what holds whatever the load): the chaos test (three servers of a
# cluster SIGKILLed 12 s apart, on each submit path), the failover test
# (4.5 s apart, each back 2 s later), one server killed and restarted three
# times, a pool's queue through its server lost for good, and Redis lost
# (a server SIGKILLed, a Cluster's shard, a Sentinel's master without a
# replica). Prints each run's figures and how many runs met every target.
# RUNS=3 by default.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
met=0
for i in $(seq "$runs"); do
	printf '\n== run %d of %d\n' "$i" "$runs"
	out=$(FLEET_TARGETS=1 go test -count=1 -v -timeout 30m \
		-run '^(TestChaosOnACluster|TestFailoverCostsOnlyTheElections|TestKillAndRestartOneServer|TestAPoolsQueueLivesWithItsStream)$' ./internal/e2e/failover/ 2>&1)
	rc=$?
	out2=$(FLEET_TARGETS=1 go test -count=1 -v -timeout 20m \
		-run '^(TestRedisOutageCostsNothing|TestRedisClusterShardLossCostsNothing|TestRedisSentinelMasterLossWithoutReplicaCostsNothing|TestDispatchersResumeWhenTheirConsumerLeaderDies)$' ./internal/e2e/ 2>&1)
	rc2=$?
	grep -E 'undisturbed:|killed|beyond the elections: p50|target missed|^ *\| |^(--- |ok|FAIL)' <<<"$out"$'\n'"$out2" | sed 's/^ *//'
	((rc == 0 && rc2 == 0)) && met=$((met + 1))
done
printf '\n== %d of %d runs met every target\n' "$met" "$runs"
