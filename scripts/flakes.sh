#!/usr/bin/env bash
# flakes: run tests many times, as make test runs them (-race), alone or
# beside a second job that loads the machine, and count what fails. Run it
# on every new test before it lands: a test that fails one run in twenty
# fails every twentieth landing. With no package it runs the census of
# docs/tests.md: every package whose tests start servers or processes.
#
# Usage: scripts/flakes.sh [-n RUNS] [-r REGEXP] [-l] [PKG...]
#   -n RUNS    how many times each package's tests run (default 20)
#   -r REGEXP  only the tests that match (default: all of the package's)
#   -l         with a load beside them: the tests of ./internal/queue,
#              ./internal/producer and ./internal/worker over and over, as
#              make test runs other packages beside each one
#
# make flakes PKGS="./internal/e2e/runs" RUNS=20 LOAD=1 runs it. It prints
# each failure as it comes, then a table: test, package, failures of runs;
# the output of each failed run is kept in the folder it names.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=20 match= load=
while getopts "n:r:l" o; do
	case $o in
	n) runs=$OPTARG ;;
	r) match=$OPTARG ;;
	l) load=1 ;;
	*) sed -n '2,17p' "$0"; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if (($# == 0)); then
	# The census: the packages whose tests import what starts a server or
	# a process.
	mapfile -t census < <(go list -f '{{.Dir}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
		grep -E 'internal/(natstest|redistest|fleettest|dockertest|kubetest|testenv)( |$)|os/exec( |$)' |
		awk -v root="$PWD" '{ sub("^" root, ".", $1); print $1 }')
	set -- "${census[@]}"
fi

out=$(mktemp -d "${TMPDIR:-/tmp}/flakes.XXXXXX")
go build -o "$out/testlog" ./internal/testlog
# A package's binary and logs are named by its path: ./internal/runs and
# ./internal/e2e/runs are two.
name() { local n=${1#./}; echo "${n//\//_}"; }
for pkg in "$@"; do
	go test -race -c -o "$out/$(name "$pkg").test" "$pkg" >/dev/null
done

loader=
if [[ -n $load ]]; then
	(
		while :; do go test -race -count=1 ./internal/queue ./internal/producer ./internal/worker >/dev/null 2>&1 || true; done
	) &
	loader=$!
fi
cleanup() {
	if [[ -n $loader ]]; then
		pkill -P "$loader" 2>/dev/null || true
		kill "$loader" 2>/dev/null || true
	fi
}
trap cleanup EXIT

echo "flakes: $runs runs of each of $*${match:+ (tests matching $match)}${load:+, beside a load}; logs in $out"
echo "$(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null)" >"$out/began"
for pkg in "$@"; do
	name=$(name "$pkg")
	if [[ ! -x $out/$name.test ]]; then
		echo "$pkg has no test to run"
		continue
	fi
	began=$SECONDS failed=0
	for i in $(seq "$runs"); do
		log="$out/$name.$i.log"
		# Each run in its package's folder, as go test runs it.
		if (cd "$pkg" && go tool test2json -p "$pkg" "$out/$name.test" -test.v=test2json -test.count=1 \
			-test.timeout=30m ${match:+-test.run "$match"}) 2>&1 | "$out/testlog" >"$log"; then
			rm -f "$log"
		else
			grep -o -- '--- FAIL: [^ ]*' "$log" | sed "s|^--- FAIL: ||; s|\$| $pkg|" >>"$out/failed" || true
			echo "run $i of $pkg failed: $(grep -o -- '--- FAIL: [^ ]*' "$log" | tr '\n' ' ')($log)"
			failed=$((failed + 1))
		fi
	done
	echo "$pkg: $failed of $runs runs failed, $((SECONDS - began)) s"
done

echo
if [[ ! -s $out/failed ]]; then
	echo "flakes: no failure in $runs runs of each package"
	exit 0
fi
printf '%-60s %-45s %s\n' test package "failed"
sort "$out/failed" | uniq -c | sort -rn | while read -r n test pkg; do
	printf '%-60s %-45s %d of %d\n' "$test" "$pkg" "$n" "$runs"
done
exit 1
