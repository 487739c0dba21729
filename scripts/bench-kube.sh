#!/usr/bin/env bash
# make bench, Kubernetes: a fleet job against the bare Job cycle of the
# same spec, on one control plane of internal/kubetest (a real API server,
# controller manager and scheduler; kwok plays the node, whose pods run for
# a second), one at a time and 4 at once, rounds alternating. See
# internal/executor/kube/kubebench. Needs no registry and no internet; the
# first run builds the control plane (hack/k8senv/build.sh, about 10
# minutes, cached afterwards).
#
#   KUBE_ROUNDS (3), KUBE_JOBS (10 per round and side, one at a time),
#   KUBE_JOBS_4 (12 per round and side, 4 at once)
set -euo pipefail
cd "$(dirname "$0")/.."

printf '\n== kubernetes: the fleet against the bare Job cycle\n'
out=$(go test -count=1 -timeout 30m -run '^$' -bench '^BenchmarkKubeFleetAgainstBareJob$' -benchtime 1x \
	./internal/executor/kube/kubebench/ 2>&1) || { echo "$out"; exit 1; }
# The report, without go test's own lines.
echo "$out" | grep -v -e '^goos:' -e '^goarch:' -e '^pkg:' -e '^cpu:' -e '^PASS' -e '^ok ' -e '^Benchmark' -e '^kubetest:'
