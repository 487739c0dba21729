#!/bin/sh
# Add the worker user of a pool to a fleet NATS configuration.
#
#   deploy/nats/add-pool.sh POOL [CONF]       (CONF defaults to fleet.conf here)
#
# It copies the block of pool "default" (between "# BEGIN WORKER POOL
# default" and "# END WORKER POOL default"), with the pool's consumer,
# subjects and key variable in place of default's, above the
# "# END WORKER POOLS" line. The new user reads its public key from
# FLEET_NKEY_WORKER_<POOL> (upper case, "-" as "_"): generate it with
# gen-nkeys.sh DIR POOL, then restart or reload the server (nats-server
# --signal reload). Adding a pool that is already there changes nothing.
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 POOL [CONF]" >&2
	exit 2
fi
pool=$1
conf=${2:-$(cd "$(dirname "$0")" && pwd)/fleet.conf}
case $pool in
*[!A-Za-z0-9_-]* | "")
	echo "$0: pool $pool: use 1 to 64 characters of [A-Za-z0-9_-]" >&2
	exit 2
	;;
esac
if [ ${#pool} -gt 64 ]; then
	echo "$0: pool $pool: at most 64 characters" >&2
	exit 2
fi
if grep -q "^[[:space:]]*# BEGIN WORKER POOL $pool\$" "$conf"; then
	echo "$0: pool $pool is already in $conf" >&2
	exit 0
fi
grep -q '^[[:space:]]*# BEGIN WORKER POOL default$' "$conf" || {
	echo "$0: $conf has no block of pool default to copy" >&2
	exit 1
}
grep -q '^[[:space:]]*# END WORKER POOLS$' "$conf" || {
	echo "$0: $conf has no \"# END WORKER POOLS\" line" >&2
	exit 1
}

var=$(printf '%s' "$pool" | tr 'a-z-' 'A-Z_')
block=$(sed -n '/^[[:space:]]*# BEGIN WORKER POOL default$/,/^[[:space:]]*# END WORKER POOL default$/p' "$conf" |
	sed -e "s/WORKER POOL default\$/WORKER POOL $pool/" \
		-e "s/FLEET_NKEY_WORKER_DEFAULT\$/FLEET_NKEY_WORKER_$var/" \
		-e "s/FLEET_JOBS_default/FLEET_JOBS_$pool/g" \
		-e "s/\\.jobs-default\\./.jobs-$pool./g" \
		-e "s/\\.jobs-default\"/.jobs-$pool\"/g" \
		-e "s/fleet\\.jobs\\.default\"/fleet.jobs.$pool\"/g" \
		-e "s/fleet\\.dlq\\.default\"/fleet.dlq.$pool\"/g" \
		-e "s/\\\$KV\\.fleet-pools\\.default\"/\\\$KV.fleet-pools.$pool\"/g" \
		-e "s/_INBOX\\.worker\\.default\\./_INBOX.worker.$pool./g")

tmp=$conf.tmp.$$
awk -v block="$block" '/^[[:space:]]*# END WORKER POOLS$/ { print block } { print }' "$conf" >"$tmp"
mv "$tmp" "$conf"
echo "added pool $pool to $conf; its key: FLEET_NKEY_WORKER_$var" >&2
