#!/usr/bin/env bash
# Builds the tools that the deployment tests (internal/deploytest) need into a
# cache keyed by version:
#   ${FLEET_TOOLS_CACHE:-/var/cache/fleet-tools}/bin/helm            helm v3.22.0
#   ${FLEET_TOOLS_CACHE:-/var/cache/fleet-tools}/bin/docker-compose  Docker Compose v2.40.3
#   ${FLEET_TOOLS_CACHE:-/var/cache/fleet-tools}/bin/nats            the nats CLI v0.5.0, the security
#                                                                     tests' outside client
#
# They come from the Go module proxy through the wrapper modules next to this
# script (helm/, compose/ and natscli/, each pinning its tool with a `tool` directive and
# a go.sum). They are separate modules: the main module never sees them.
# Cold, each takes about 1.5 minutes on 2 cores; when a binary is present and
# was built from the same inputs, nothing is rebuilt.
#
# Usage: hack/tools/build.sh [TOOL...]          TOOL: helm, docker-compose, nats (default: all);
#                                                prints the bin directory on stdout
#        hack/tools/build.sh --check [TOOL...]  exit 0 if those tools are cached and current
#        FLEET_TOOLS_REBUILD=1 hack/tools/build.sh   (ignore the cache)
set -euo pipefail

HELM_VERSION=v3.22.0
COMPOSE_VERSION=v2.40.3
NATSCLI_VERSION=v0.5.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${FLEET_TOOLS_CACHE:-/var/cache/fleet-tools}"
bin_dir="${cache_root}/bin"

log() { printf 'tools build: %s\n' "$*" >&2; }

# module_dir TOOL: the wrapper module that pins TOOL.
module_dir() {
	case "$1" in
	helm) echo "$here/helm" ;;
	docker-compose) echo "$here/compose" ;;
	nats) echo "$here/natscli" ;;
	*)
		log "unknown tool $1 (helm, docker-compose, nats)"
		exit 2
		;;
	esac
}

# stamp_key TOOL: a hash of everything the binary is built from.
stamp_key() {
	local dir
	dir="$(module_dir "$1")"
	{
		printf 'tool=%s helm=%s compose=%s go=%s\n' "$1" "$HELM_VERSION" "$COMPOSE_VERSION" "$(go env GOVERSION)"
		cat "$dir/go.mod" "$dir/go.sum"
	} | sha256sum | cut -d' ' -f1
}

up_to_date() {
	local tool="$1"
	[[ -x "$bin_dir/$tool" && -f "$bin_dir/.$tool.stamp" ]] || return 1
	[[ "$(cat "$bin_dir/.$tool.stamp")" == "$(stamp_key "$tool")" ]]
}

build_helm() {
	local out="$1" dir client_go minor ldflags
	dir="$(module_dir helm)"
	# As helm's own Makefile does: the version, and the Kubernetes version that
	# `helm template` and `helm lint` assume, taken from the client-go helm uses.
	client_go="$(cd "$dir" && go list -m -f '{{.Version}}' k8s.io/client-go)"
	minor="${client_go#v0.}"
	minor="${minor%%.*}"
	ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
	ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
	for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
		ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${minor}"
	done
	log "building helm ${HELM_VERSION} (one to two minutes cold)"
	(cd "$dir" && go build -p 2 -trimpath -ldflags "$ldflags" -o "$out" helm.sh/helm/v3/cmd/helm)
}

build_compose() {
	local out="$1" dir
	dir="$(module_dir docker-compose)"
	log "building Docker Compose ${COMPOSE_VERSION} (about two minutes cold)"
	(cd "$dir" && go build -p 2 -trimpath \
		-ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=${COMPOSE_VERSION}" \
		-o "$out" github.com/docker/compose/v2/cmd)
}

build_nats() {
	local out="$1" dir
	dir="$(module_dir nats)"
	log "building the nats CLI ${NATSCLI_VERSION} (about a minute cold)"
	(cd "$dir" && go build -p 2 -trimpath -ldflags "-s -w -X main.version=${NATSCLI_VERSION}" \
		-o "$out" github.com/nats-io/natscli/nats)
}

command -v go >/dev/null || {
	log "go is not installed"
	exit 1
}

check=0
if [[ "${1:-}" == --check ]]; then
	check=1
	shift
fi
tools=("$@")
((${#tools[@]})) || tools=(helm docker-compose nats)
for t in "${tools[@]}"; do module_dir "$t" >/dev/null; done

if ((check)); then
	for t in "${tools[@]}"; do up_to_date "$t" || exit 1; done
	exit 0
fi

mkdir -p "$bin_dir"
# Several test binaries may call this at once: one builds, the others wait.
exec 9>"$cache_root/.lock"
flock 9

export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
work=""
trap 'rm -rf "$work"' EXIT
for t in "${tools[@]}"; do
	if [[ "${FLEET_TOOLS_REBUILD:-}" != 1 ]] && up_to_date "$t"; then
		continue
	fi
	rm -f "$bin_dir/.$t.stamp"
	work="$(mktemp -d "$cache_root/build.XXXXXX")"
	start=$SECONDS
	case "$t" in
	helm) build_helm "$work/$t" ;;
	docker-compose) build_compose "$work/$t" ;;
	nats) build_nats "$work/$t" ;;
	esac
	mv -f "$work/$t" "$bin_dir/$t"
	rm -rf "$work"
	work=""
	stamp_key "$t" >"$bin_dir/.$t.stamp"
	log "$t done in $((SECONDS - start)) s"
done
echo "$bin_dir"
