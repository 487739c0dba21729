#!/bin/sh
# Add the worker user of a pool to a fleet NATS configuration.
#
#   deploy/nats/add-pool.sh POOL [CONF]       (CONF defaults to fleet.conf here)
#
# It copies the block of pool "default" (between "# BEGIN WORKER POOL
# default" and "# END WORKER POOL default") with the pool's name in place of
# default's (its stream FLEET_POOL_<pool>, its queues' consumers, subjects
# fleet.p.<pool>.*, fleet.t.*.ev.<pool>.*, fleet.dlq.<pool>.*,
# fleet.stop.<pool>.*, its runs' node ends fleet.r.*.*.node.<pool>.*, its
# bucket fleet-artifacts-<pool>, its inbox and its key variable) above the
# "# END WORKER POOLS" line; and the lines that keep
# the dispatcher and operators off the pool's consumer (the block "# BEGIN
# POOL CONSUMERS default") above "# END POOL CONSUMERS". The new user reads
# its public key from FLEET_NKEY_WORKER_<POOL> (upper case, "-" as "_"):
# generate it with gen-nkeys.sh DIR POOL, then restart or reload the server
# (nats-server --signal reload). Adding a pool that is already there changes
# nothing.
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
for marker in '# BEGIN WORKER POOL default' '# END WORKER POOLS' '# BEGIN POOL CONSUMERS default' '# END POOL CONSUMERS'; do
	grep -q "^[[:space:]]*$marker\$" "$conf" || {
		echo "$0: $conf has no \"$marker\" line" >&2
		exit 1
	}
done

var=$(printf '%s' "$pool" | tr 'a-z-' 'A-Z_')
# copy BEGIN END: the lines from BEGIN to END, pool default's name replaced
# by the new pool's (every "default" in the block is the pool's name, but
# in q<priority>-default, the queues of tenant default).
copy() {
	sed -n "/^[[:space:]]*$1 default\$/,/^[[:space:]]*$2 default\$/p" "$conf" |
		sed -e "s/FLEET_NKEY_WORKER_DEFAULT\$/FLEET_NKEY_WORKER_$var/" -e 's/\.q\([1-5]\)-default/.q\1-@TENANT@/g' \
			-e "s/default/$pool/g" -e 's/@TENANT@/default/g'
}
workers=$(copy '# BEGIN WORKER POOL' '# END WORKER POOL')
consumers=$(copy '# BEGIN POOL CONSUMERS' '# END POOL CONSUMERS')

tmp=$conf.tmp.$$
awk -v workers="$workers" -v consumers="$consumers" '
	/^[[:space:]]*# END WORKER POOLS$/ { print workers }
	/^[[:space:]]*# END POOL CONSUMERS$/ { print consumers }
	{ print }' "$conf" >"$tmp"
mv "$tmp" "$conf"
echo "added pool $pool to $conf; its key: FLEET_NKEY_WORKER_$var" >&2
