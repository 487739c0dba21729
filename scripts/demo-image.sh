#!/usr/bin/env bash
# Builds fleet-demo:local, the image the demo's jobs run in on the Docker
# executor, without a registry: a root filesystem holding this machine's own
# sh, cat, tee and sleep with the libraries they load, imported with
# `docker import`. Prints the image name; fails if Docker is not there.
set -euo pipefail
image=fleet-demo:local
docker image inspect "$image" >/dev/null 2>&1 && { echo "$image"; exit 0; }

root=$(mktemp -d "${TMPDIR:-/tmp}/fleet-demo-root.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/tmp" "$root/fleet"
for tool in sh cat tee sleep; do
	path=$(command -v "$tool")
	cp -L "$path" "$root/bin/$tool"
	# Each library the tool loads, at the same path in the image.
	for lib in $(ldd "$path" | grep -o '/[^ ]*'); do
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
done
chmod 1777 "$root/tmp"
tar -C "$root" -c . | docker import --change 'ENV PATH=/bin' - "$image" >/dev/null
echo "$image"
