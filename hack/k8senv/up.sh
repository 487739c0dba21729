#!/usr/bin/env bash
# Starts a Kubernetes control plane for tests, on 127.0.0.1 only:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and kwok as
# the kubelet of one fake node. Returns once the API is healthy and the node
# is Ready.
#
# Usage: hack/k8senv/up.sh RUN_DIR
#
# RUN_DIR receives the PKI, the kubeconfigs, the etcd data and the logs, and:
#   RUN_DIR/admin.kubeconfig  cluster-admin (O=system:masters)
#   RUN_DIR/env               shell-sourceable: KUBECONFIG, KUBECACHEDIR,
#                             FLEET_K8S_API_SERVER, FLEET_K8S_BIN, the pids...
#   RUN_DIR/logs/             one log per component
#   RUN_DIR/pod-logs/         files that kwok serves as container logs
# Stop with hack/k8senv/down.sh RUN_DIR.
#
# Environment:
#   FLEET_K8S_CACHE      binary cache (see build.sh)
#   FLEET_K8S_WATCH_PID  if set, a watchdog runs down.sh when that process
#                        exits, so a killed test binary leaves nothing behind
#   FLEET_K8S_TIMEOUT    seconds to wait for each component (default 60)
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 RUN_DIR" >&2
	exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
timeout="${FLEET_K8S_TIMEOUT:-60}"

log() { printf 'k8senv up: %s\n' "$*" >&2; }
die() {
	log "$*"
	exit 1
}

# down.sh deletes RUN_DIR, so it must be new, empty, or an earlier run's.
mkdir -p "$1"
run="$(cd "$1" && pwd)"
marker="$run/.fleet-k8senv"
if [[ ! -f "$marker" && -n "$(ls -A "$run")" ]]; then
	die "$run is not empty and was not made by up.sh; give a new or empty directory"
fi
touch "$marker"

for tool in openssl base64; do
	command -v "$tool" >/dev/null || die "$tool is required but not installed"
done

if [[ -f "$run/pids" ]]; then
	while read -r _ pid; do
		if kill -0 "$pid" 2>/dev/null; then
			die "$run is in use (pid $pid is running); run down.sh first"
		fi
	done <"$run/pids"
fi

bin="$("$here/build.sh")"

# Start from a clean directory: an old etcd keeps an old node lease, which
# makes a new kwok wait.
rm -rf "${run:?}"/{pki,etcd,logs,pod-logs,kube-cache,kwok,pids,env,*.kubeconfig}
mkdir -p "$run"/{pki,etcd,logs,pod-logs,kube-cache,kwok}
chmod 700 "$run/pki" "$run/etcd"
: >"$run/pids"

export KUBECONFIG="$run/admin.kubeconfig"
export KUBECACHEDIR="$run/kube-cache"
export KWOK_WORKDIR="$run/kwok"

ok=0
cleanup() {
	if [[ $ok != 1 ]]; then
		log "start failed; logs are in $run/logs"
		for f in "$run"/logs/*.log; do
			[[ -s "$f" ]] || continue
			printf -- '--- %s (last lines)\n' "$(basename "$f")" >&2
			tail -n 15 "$f" >&2
		done
		FLEET_K8S_KEEP_RUN_DIR=1 "$here/down.sh" "$run" >&2 || true
	fi
}
trap cleanup EXIT

# --- ports ------------------------------------------------------------------

used_ports=" "
port_is_free() {
	# Nothing may listen on it, on any loopback or wildcard address.
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
pick_port() {
	local p _
	for _ in $(seq 1 200); do
		p=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
		if [[ "$used_ports" != *" $p "* ]] && port_is_free "$p"; then
			used_ports+="$p "
			echo "$p"
			return 0
		fi
	done
	die "no free port found"
}
# The tests pick the six ports themselves (FLEET_K8S_PORTS), claimed so
# that no other test binary of the machine takes them; alone, up.sh picks.
if [[ -n "${FLEET_K8S_PORTS:-}" ]]; then
	read -r etcd_port etcd_peer_port api_port kcm_port sched_port kwok_port <<<"$FLEET_K8S_PORTS"
	[[ -n "$kwok_port" ]] || die "FLEET_K8S_PORTS holds six ports, not: $FLEET_K8S_PORTS"
else
	etcd_port="$(pick_port)"
	etcd_peer_port="$(pick_port)"
	api_port="$(pick_port)"
	kcm_port="$(pick_port)"
	sched_port="$(pick_port)"
	kwok_port="$(pick_port)"
fi

# --- PKI --------------------------------------------------------------------

pki="$run/pki"
openssl_quiet() { openssl "$@" 2>>"$run/logs/openssl.log"; }

openssl_quiet req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
	-keyout "$pki/ca.key" -out "$pki/ca.crt" -days 3650 -subj "/CN=fleet-k8senv-ca" \
	-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# issue NAME SUBJECT EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
issue() {
	local name="$1" subj="$2" eku="$3" san="${4:-}"
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$eku"
		[[ -z "$san" ]] || echo "subjectAltName=$san"
	} >"$pki/$name.ext"
	openssl_quiet req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
		-keyout "$pki/$name.key" -out "$pki/$name.csr" -subj "$subj"
	openssl_quiet x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
		-CAcreateserial -days 3650 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
	rm -f "$pki/$name.csr" "$pki/$name.ext"
}

issue apiserver "/CN=kube-apiserver" serverAuth \
	"IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
issue admin "/O=system:masters/CN=fleet-admin" clientAuth
issue controller-manager "/CN=system:kube-controller-manager" clientAuth
issue scheduler "/CN=system:kube-scheduler" clientAuth
# kwok plays every kubelet and also reads its own CRDs, so it is an admin.
issue kwok "/O=system:masters/CN=fleet-kwok" clientAuth
issue kwok-serving "/CN=fake" serverAuth "IP:127.0.0.1,DNS:localhost"
issue components-serving "/CN=fleet-k8senv-components" serverAuth "IP:127.0.0.1,DNS:localhost"
openssl_quiet genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key"
openssl_quiet pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
chmod 600 "$pki"/*.key

api_url="https://127.0.0.1:${api_port}"

# kubeconfig NAME CERT_NAME: credentials embedded, so the file stands alone.
kubeconfig() {
	local file="$run/$1.kubeconfig" cert="$2"
	cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fleet-k8senv
  cluster:
    server: ${api_url}
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: ${cert}
  user:
    client-certificate-data: $(base64 -w0 <"$pki/$cert.crt")
    client-key-data: $(base64 -w0 <"$pki/$cert.key")
contexts:
- name: fleet-k8senv
  context:
    cluster: fleet-k8senv
    user: ${cert}
current-context: fleet-k8senv
EOF
	chmod 600 "$file"
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig kwok kwok

# --- processes --------------------------------------------------------------

# start NAME COMMAND...: runs in the background, output to logs/NAME.log, and
# records the pid for down.sh.
start() {
	local name="$1"
	shift
	"$@" </dev/null >"$run/logs/$name.log" 2>&1 &
	echo "$name $!" >>"$run/pids"
}

alive() { kill -0 "$(awk -v n="$1" '$1 == n {print $2}' "$run/pids")" 2>/dev/null; }

# wait_for NAME DESCRIPTION COMMAND...: polls until COMMAND succeeds while NAME runs.
wait_for() {
	local name="$1" what="$2" deadline=$((SECONDS + timeout))
	shift 2
	until "$@" >/dev/null 2>&1; do
		alive "$name" || die "$name exited while waiting for $what"
		((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what"
		sleep 0.2
	done
}

kubectl() { "$bin/kubectl" --kubeconfig "$run/admin.kubeconfig" --request-timeout=10s "$@"; }

if [[ -n "${FLEET_K8S_WATCH_PID:-}" ]]; then
	watch_pid="$FLEET_K8S_WATCH_PID"
	(
		trap '' INT
		while kill -0 "$watch_pid" 2>/dev/null && [[ -f "$run/pids" ]]; do
			sleep 1
		done
		if [[ -f "$run/pids" ]]; then
			exec "$here/down.sh" "$run"
		fi
	) </dev/null >>"$run/logs/watchdog.log" 2>&1 &
	echo "watchdog $!" >>"$run/pids"
fi

log "starting etcd on 127.0.0.1:${etcd_port}"
start etcd "$bin/etcd" \
	--name=fleet \
	--data-dir="$run/etcd" \
	--listen-client-urls="http://127.0.0.1:${etcd_port}" \
	--advertise-client-urls="http://127.0.0.1:${etcd_port}" \
	--listen-peer-urls="http://127.0.0.1:${etcd_peer_port}" \
	--initial-advertise-peer-urls="http://127.0.0.1:${etcd_peer_port}" \
	--initial-cluster="fleet=http://127.0.0.1:${etcd_peer_port}" \
	--unsafe-no-fsync \
	--log-level=warn
wait_for etcd "etcd to listen" bash -c "exec 3<>/dev/tcp/127.0.0.1/${etcd_port}"

log "starting kube-apiserver on ${api_url}"
start kube-apiserver "$bin/kube-apiserver" \
	--etcd-servers="http://127.0.0.1:${etcd_port}" \
	--bind-address=127.0.0.1 \
	--advertise-address=127.0.0.1 \
	--secure-port="${api_port}" \
	--cert-dir="$pki" \
	--tls-cert-file="$pki/apiserver.crt" \
	--tls-private-key-file="$pki/apiserver.key" \
	--client-ca-file="$pki/ca.crt" \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$pki/sa.pub" \
	--service-account-signing-key-file="$pki/sa.key" \
	--service-cluster-ip-range=10.96.0.0/16 \
	--authorization-mode=Node,RBAC \
	--endpoint-reconciler-type=none \
	--allow-privileged=true \
	--kubelet-preferred-address-types=InternalIP \
	--kubelet-certificate-authority="$pki/ca.crt" \
	--profiling=false \
	--v=1
wait_for kube-apiserver "the API server to be ready" kubectl get --raw /readyz

log "starting kube-controller-manager and kube-scheduler"
start kube-controller-manager "$bin/kube-controller-manager" \
	--kubeconfig="$run/controller-manager.kubeconfig" \
	--authentication-kubeconfig="$run/controller-manager.kubeconfig" \
	--authorization-kubeconfig="$run/controller-manager.kubeconfig" \
	--bind-address=127.0.0.1 \
	--secure-port="${kcm_port}" \
	--tls-cert-file="$pki/components-serving.crt" \
	--tls-private-key-file="$pki/components-serving.key" \
	--leader-elect=false \
	--use-service-account-credentials=true \
	--service-account-private-key-file="$pki/sa.key" \
	--root-ca-file="$pki/ca.crt" \
	--cluster-signing-cert-file="$pki/ca.crt" \
	--cluster-signing-key-file="$pki/ca.key" \
	--profiling=false \
	--v=1
start kube-scheduler "$bin/kube-scheduler" \
	--kubeconfig="$run/scheduler.kubeconfig" \
	--authentication-kubeconfig="$run/scheduler.kubeconfig" \
	--authorization-kubeconfig="$run/scheduler.kubeconfig" \
	--bind-address=127.0.0.1 \
	--secure-port="${sched_port}" \
	--tls-cert-file="$pki/components-serving.crt" \
	--tls-private-key-file="$pki/components-serving.key" \
	--leader-elect=false \
	--profiling=false \
	--v=1

kubectl apply -f "$here/manifests/kwok-logs-crds.yaml" >>"$run/logs/setup.log"
wait_for kube-apiserver "kwok's CRDs" kubectl wait --for=condition=Established --timeout=5s \
	crd/clusterlogs.kwok.x-k8s.io crd/logs.kwok.x-k8s.io

log "starting kwok (server on 127.0.0.1:${kwok_port})"
stage_configs=()
for f in "$here"/stages/*.yaml; do
	stage_configs+=("--config=$f")
done
start kwok "$bin/kwok" \
	"${stage_configs[@]}" \
	--kubeconfig="$run/kwok.kubeconfig" \
	--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
	--node-ip=127.0.0.1 \
	--node-port="${kwok_port}" \
	--server-address="127.0.0.1:${kwok_port}" \
	--tls-cert-file="$pki/kwok-serving.crt" \
	--tls-private-key-file="$pki/kwok-serving.key" \
	--cidr=10.244.0.1/16 \
	--node-lease-duration-seconds=40 \
	--enable-crds=ClusterLogs,Logs

kubectl apply -f - >>"$run/logs/setup.log" <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: fake
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: fake
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  capacity:
    cpu: "4"
    memory: 8Gi
    pods: "110"
    ephemeral-storage: 100Gi
    nvidia.com/gpu: "2"
  allocatable:
    cpu: "4"
    memory: 8Gi
    pods: "110"
    ephemeral-storage: 100Gi
    nvidia.com/gpu: "2"
EOF

# A second node with GPUs of one model, tainted as GPU nodes often are:
# only pods that tolerate gpu=true:NoSchedule land there.
kubectl apply -f - >>"$run/logs/setup.log" <<'EOF2'
apiVersion: v1
kind: Node
metadata:
  name: gpu-h100
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: gpu-h100
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    nvidia.com/gpu.product: H100
spec:
  taints:
  - key: gpu
    value: "true"
    effect: NoSchedule
status:
  capacity:
    cpu: "8"
    memory: 32Gi
    pods: "110"
    ephemeral-storage: 100Gi
    nvidia.com/gpu: "4"
  allocatable:
    cpu: "8"
    memory: 32Gi
    pods: "110"
    ephemeral-storage: 100Gi
    nvidia.com/gpu: "4"
EOF2

node_schedulable() {
	local out
	out="$(kubectl get node fake -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}|{.spec.taints}')"
	[[ "$out" == "True|" ]]
}
wait_for kwok "node fake to be Ready and untainted" node_schedulable
gpu_node_ready() {
	[[ "$(kubectl get node gpu-h100 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == "True" ]]
}
wait_for kwok "node gpu-h100 to be Ready" gpu_node_ready
wait_for kube-controller-manager "the controller manager to be healthy" \
	kubectl get --raw "/healthz" --server="https://127.0.0.1:${kcm_port}"
wait_for kube-scheduler "the scheduler to be healthy" \
	kubectl get --raw "/healthz" --server="https://127.0.0.1:${sched_port}"
wait_for kube-controller-manager "the default service account" kubectl -n default get serviceaccount default

q() { printf '%q' "$1"; }
{
	echo "# Written by hack/k8senv/up.sh; source it to use this cluster."
	echo "export FLEET_K8S_RUN_DIR=$(q "$run")"
	echo "export FLEET_K8S_BIN=$(q "$bin")"
	echo "export KUBECONFIG=$(q "$run/admin.kubeconfig")"
	echo "export KUBECACHEDIR=$(q "$run/kube-cache")"
	echo "export FLEET_K8S_API_SERVER=$(q "$api_url")"
	echo "export FLEET_K8S_KWOK_SERVER=$(q "https://127.0.0.1:${kwok_port}")"
	echo "export FLEET_K8S_POD_LOG_DIR=$(q "$run/pod-logs")"
	while read -r name pid; do
		var="${name//-/_}"
		echo "export FLEET_K8S_${var^^}_PID=$pid"
	done <"$run/pids"
} >"$run/env"

ok=1
log "ready in ${SECONDS}s: source $run/env"
