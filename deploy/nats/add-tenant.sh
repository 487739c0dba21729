#!/bin/sh
# Add the producer user of a tenant to a fleet NATS configuration.
#
#   deploy/nats/add-tenant.sh TENANT [CONF]   (CONF defaults to fleet.conf here)
#
# It copies the block of tenant "default" (between "# BEGIN TENANT default"
# and "# END TENANT default") with the tenant's name in place of default's
# (its subjects fleet.t.<tenant>.*, its runs' requests and live messages
# among them, its feed FLEET_FEED_<tenant>, its bucket fleet-uploads-<tenant>, the chunks
# $O.*.C.<tenant>.* and records fleet.p.*.*.<tenant>.* it may read, its
# inbox _INBOX.producer.<tenant> and its key variable) above the
# "# END TENANTS" line. The new user reads its public key from
# FLEET_NKEY_PRODUCER_<TENANT> (upper case, "-" as "_"): generate it with
# gen-nkeys.sh -t TENANT DIR, then restart or reload the server (nats-server
# --signal reload). Its producers start with --nats-inbox-prefix
# _INBOX.producer.<tenant> and --tenant <tenant>. Adding a tenant that is
# already there changes nothing.
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 TENANT [CONF]" >&2
	exit 2
fi
tenant=$1
conf=${2:-$(cd "$(dirname "$0")" && pwd)/fleet.conf}
case $tenant in
*[!A-Za-z0-9_-]* | "")
	echo "$0: tenant $tenant: use 1 to 64 characters of [A-Za-z0-9_-]" >&2
	exit 2
	;;
esac
if [ ${#tenant} -gt 64 ]; then
	echo "$0: tenant $tenant: at most 64 characters" >&2
	exit 2
fi
if grep -q "^[[:space:]]*# BEGIN TENANT $tenant\$" "$conf"; then
	echo "$0: tenant $tenant is already in $conf" >&2
	exit 0
fi
for marker in '# BEGIN TENANT default' '# END TENANTS'; do
	grep -q "^[[:space:]]*$marker\$" "$conf" || {
		echo "$0: $conf has no \"$marker\" line" >&2
		exit 1
	}
done

var=$(printf '%s' "$tenant" | tr 'a-z-' 'A-Z_')
# Every "default" in the block is the tenant's name.
block=$(sed -n '/^[[:space:]]*# BEGIN TENANT default$/,/^[[:space:]]*# END TENANT default$/p' "$conf" |
	sed -e "s/FLEET_NKEY_PRODUCER_DEFAULT\$/FLEET_NKEY_PRODUCER_$var/" -e "s/default/$tenant/g")

tmp=$conf.tmp.$$
awk -v block="$block" '/^[[:space:]]*# END TENANTS$/ { print block } { print }' "$conf" >"$tmp"
mv "$tmp" "$conf"
echo "added tenant $tenant to $conf; its key: FLEET_NKEY_PRODUCER_$var" >&2
