// Package deploytest tests the deployment files at the repository root and
// under deploy/: the Dockerfile and the image it makes, docker-compose.yml,
// and the Helm chart deploy/helm/fleet. It holds tests only.
//
// They need helm v3 and Docker Compose v2, which hack/tools/build.sh builds
// from the Go module proxy into /var/cache/fleet-tools/bin (FLEET_HELM and
// FLEET_COMPOSE name other binaries), a Docker daemon, and the Kubernetes
// control plane of internal/kubetest. A missing one skips its tests when CI
// is unset and fails them when CI=true.
//
// No registry is needed: the image under test is the Dockerfile's
// runtime-local target, built on the daemon from binaries compiled here, and
// the compose test runs the fleet's own services with the local image. The
// default multi-stage target needs base images from a registry; it is
// checked by reading the Dockerfile, not by building it.
package deploytest
