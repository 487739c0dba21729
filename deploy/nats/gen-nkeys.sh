#!/bin/sh
# Generate the NKeys of a fleet's NATS users: the dispatcher, the operator,
# one producer per tenant and one worker per pool.
#
#   deploy/nats/gen-nkeys.sh [-t TENANT]... DIR [POOL...]
#
# Tenants default to "default" (the tenant of an open fleet), pools to
# "default". For each of dispatcher, operator, producer-<tenant> and
# worker-<pool> it writes DIR/<role>.nk, the seed (the secret: give it to
# that role's processes with --nats-nkey or FLEET_NATS_NKEY, and to nobody
# else), readable only by its owner; and it writes DIR/nkeys.env, the
# public keys as the variables fleet.conf reads (FLEET_NKEY_DISPATCHER=U...,
# FLEET_NKEY_PRODUCER_<TENANT>, FLEET_NKEY_WORKER_<POOL>). Public keys are
# not secrets: pass nkeys.env to the server's environment (systemd
# EnvironmentFile, a ConfigMap, `set -a; . DIR/nkeys.env; set +a`).
#
# An existing seed is kept, so running it again with a new pool or tenant
# adds its key without changing the others.
#
# It uses `nk` (github.com/nats-io/nkeys/nk) when installed, else builds it
# with the Go toolchain from this repository's module cache.
set -eu

usage() {
	echo "usage: $0 [-t TENANT]... DIR [POOL...]" >&2
	exit 2
}
tenants=""
while getopts t: opt; do
	case $opt in
	t) tenants="$tenants $OPTARG" ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
dir=$1
shift
[ $# -gt 0 ] || set -- default
[ -n "$tenants" ] || tenants=default

here=$(cd "$(dirname "$0")" && pwd)
if command -v nk >/dev/null 2>&1; then
	nk=nk
else
	bin=$(mktemp -d)
	trap 'rm -rf "$bin"' EXIT
	(cd "$here" && go build -o "$bin/nk" github.com/nats-io/nkeys/nk)
	nk=$bin/nk
fi

umask 077
mkdir -p "$dir"

check() {
	case $2 in
	*[!A-Za-z0-9_-]* | "")
		echo "$0: $1 $2: use 1 to 64 characters of [A-Za-z0-9_-]" >&2
		exit 2
		;;
	esac
}
roles="dispatcher operator"
for tenant in $tenants; do
	check tenant "$tenant"
	roles="$roles producer-$tenant"
done
for pool in "$@"; do
	check pool "$pool"
	roles="$roles worker-$pool"
done

env=$dir/nkeys.env
tmp=$env.tmp
: >"$tmp"
for role in $roles; do
	seed=$dir/$role.nk
	[ -s "$seed" ] || "$nk" -gen user >"$seed"
	pub=$("$nk" -inkey "$seed" -pubout)
	var=FLEET_NKEY_$(printf '%s' "$role" | tr 'a-z-' 'A-Z_')
	printf '%s=%s\n' "$var" "$pub" >>"$tmp"
done
# Keep the keys of pools and tenants not named this time.
if [ -f "$env" ]; then
	while IFS= read -r line; do
		grep -q "^${line%%=*}=" "$tmp" || printf '%s\n' "$line" >>"$tmp"
	done <"$env"
fi
mv "$tmp" "$env"
chmod 644 "$env"
echo "seeds in $dir/*.nk; public keys in $env:" >&2
cat "$env"
