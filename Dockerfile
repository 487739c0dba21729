# The fleet image: dispatcher, worker and fleetctl, static binaries on a
# minimal base, run as the non-root user 65532. One image serves every role;
# the container's command names the binary:
#
#   docker run --rm fleet:dev dispatcher --help
#   docker run --rm fleet:dev worker --executor kubernetes ...
#
# Two targets make the same image (see docs/running.md, "Container image"):
#
#   docker build -t fleet:dev .
#       runtime, the default: compiles in the golang image and copies the
#       binaries onto distroless/static. Needs BuildKit (the default builder
#       since Docker 23) and a registry that serves the two base images.
#
#   CGO_ENABLED=0 make build
#   docker build --target runtime-local -t fleet:dev .
#       runtime-local: the same layout on an empty base, from the static
#       binaries in bin/ (static: the image has no libc). It needs no
#       registry, and works with the legacy builder too; the tests in
#       internal/deploytest build it this way. It has no CA bundle (mount
#       your CA and use --nats-ca, or rediss:// with SSL_CERT_FILE) and no
#       /etc/passwd: the user is numeric.
#
# No "# syntax=" line: it would make BuildKit fetch its Dockerfile frontend
# from a registry even for runtime-local. The built-in frontend has all this
# file uses.

ARG GO_VERSION=1.26.8
# distroless/static: CA certificates, tzdata, /etc/passwd with nonroot (65532)
# and /tmp; no shell, no package manager. Pin a digest in production.
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# --- runtime-local: binaries built on the host, no base image ---------------
FROM scratch AS runtime-local
COPY bin/dispatcher bin/worker bin/fleetctl /usr/local/bin/
ENV PATH=/usr/local/bin \
    FLEET_DATA_DIR=/var/lib/fleet
# Writable state (the embedded stores, attempt workspaces) lives under
# /var/lib/fleet; mount a volume, an emptyDir or a tmpfs there.
WORKDIR /var/lib/fleet
USER 65532:65532
# 8080: the dispatcher's HTTP API; 9090: the worker's --metrics-addr, by
# convention; 4222 and 6379: NATS and Redis of `dispatcher --embedded`.
EXPOSE 8080 9090
CMD ["dispatcher", "--help"]

# --- build: compile the three commands --------------------------------------
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath \
      -ldflags "-s -w -X github.com/fleet-dev/fleet/internal/version.Version=${VERSION}" \
      -o /out/bin/ ./cmd/dispatcher ./cmd/worker ./cmd/fleetctl \
 && mkdir -p /out/state/fleet

# --- runtime (default): the image to ship -----------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=build /out/bin/ /usr/local/bin/
# /var/lib/fleet is owned by the runtime user, so that a new named volume
# mounted there is writable too.
COPY --from=build --chown=65532:65532 /out/state/ /var/lib/
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    FLEET_DATA_DIR=/var/lib/fleet
WORKDIR /var/lib/fleet
USER 65532:65532
EXPOSE 8080 9090
CMD ["dispatcher", "--help"]
