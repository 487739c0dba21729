#!/bin/sh
# Generate the NKeys of a fleet's NATS users: one per role, and one worker
# key per pool.
#
#   deploy/nats/gen-nkeys.sh DIR [POOL...]     (pools default to "default")
#
# For each of dispatcher, producer and worker-<pool> it writes DIR/<role>.nk,
# the seed (the secret: give it to that role's processes with --nats-nkey or
# FLEET_NATS_NKEY, and to nobody else), readable only by its owner; and it
# writes DIR/nkeys.env, the public keys as the variables fleet.conf reads
# (FLEET_NKEY_DISPATCHER=U...). Public keys are not secrets: pass
# nkeys.env to the server's environment (systemd EnvironmentFile, a
# ConfigMap, `set -a; . DIR/nkeys.env; set +a`).
#
# An existing seed is kept, so running it again with a new pool adds that
# pool's key without changing the others.
#
# It uses `nk` (github.com/nats-io/nkeys/nk) when installed, else builds it
# with the Go toolchain from this repository's module cache.
set -eu

if [ $# -lt 1 ]; then
	echo "usage: $0 DIR [POOL...]" >&2
	exit 2
fi
dir=$1
shift
[ $# -gt 0 ] || set -- default

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

roles="dispatcher producer"
for pool in "$@"; do
	case $pool in
	*[!A-Za-z0-9_-]* | "")
		echo "$0: pool $pool: use 1 to 64 characters of [A-Za-z0-9_-]" >&2
		exit 2
		;;
	esac
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
# Keep the keys of pools not named this time.
if [ -f "$env" ]; then
	while IFS= read -r line; do
		grep -q "^${line%%=*}=" "$tmp" || printf '%s\n' "$line" >>"$tmp"
	done <"$env"
fi
mv "$tmp" "$env"
chmod 644 "$env"
echo "seeds in $dir/*.nk; public keys in $env:" >&2
cat "$env"
