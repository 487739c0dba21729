#!/usr/bin/env bash
# Stops what hack/k8senv/up.sh RUN_DIR started, by the pids it recorded, and
# removes RUN_DIR (set FLEET_K8S_KEEP_RUN_DIR=1 to keep it, e.g. for the logs).
# Safe to run twice.
#
# Usage: hack/k8senv/down.sh RUN_DIR
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 RUN_DIR" >&2
	exit 2
fi
[[ -d "$1" ]] || exit 0
run="$(cd "$1" && pwd)"

# ours PID NAME: the process is alive (not a zombie) and is the one up.sh
# started, judged by its command line naming the run directory, so that a
# recycled pid is never signalled.
ours() {
	local pid="$1" name="$2" state cmdline
	[[ -r "/proc/$pid/stat" ]] || return 1
	state="$(sed -E 's/^.*\) (.).*$/\1/' "/proc/$pid/stat" 2>/dev/null)" || return 1
	[[ "$state" != Z ]] || return 1
	cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
	if [[ "$name" == watchdog ]]; then
		[[ "$cmdline" == *up.sh* ]]
	else
		[[ "$cmdline" == *"$run"* ]]
	fi
}

if [[ -f "$run/pids" ]]; then
	# Everything here is disposable (etcd's data is wiped at the next start),
	# so a short grace period is enough before SIGKILL.
	mapfile -t entries < <(tac "$run/pids")
	pids=()
	for entry in "${entries[@]}"; do
		name="${entry% *}"
		pid="${entry##* }"
		# The watchdog may be the one running this script.
		[[ "$pid" == "$$" || "$pid" == "$PPID" ]] && continue
		ours "$pid" "$name" || continue
		kill -TERM "$pid" 2>/dev/null || true
		pids+=("$pid $name")
	done
	deadline=$((SECONDS + 3))
	for entry in "${pids[@]}"; do
		pid="${entry% *}"
		name="${entry#* }"
		while ours "$pid" "$name" && ((SECONDS < deadline)); do
			sleep 0.1
		done
		if ours "$pid" "$name"; then
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	rm -f "$run/pids"
fi

# Only a directory that up.sh marked as its own is removed.
if [[ "${FLEET_K8S_KEEP_RUN_DIR:-}" != 1 && -f "$run/.fleet-k8senv" ]]; then
	rm -rf "$run"
fi
