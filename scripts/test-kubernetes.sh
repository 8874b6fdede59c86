#!/usr/bin/env bash
# make test-kubernetes: a real single-node Kubernetes v1.34 cluster on this
# machine, the chart installed on it with its gateway Deployment, and
# sandboxes run through the gateway's Service on the DaemonSet's node
# daemon, across that daemon's pod being replaced; then a teardown that
# leaves the host as it was. Not part of `make test` (root, minutes, and it
# needs the image built); CI runs it after make test (.ci/run).
#
# What it builds (issue 26 records why each piece is as it is):
#   - the binaries of scripts/kube-assets.sh (KUBE_ASSETS_ALL=1), cached;
#   - containerd, runc and the CNI plugins from Debian; containerd with
#     restrict_oom_score_adj (root here lacks CAP_SYS_RESOURCE), the kubelet
#     on cgroupfs with failCgroupV1: false (hybrid host) and oomScoreAdj 0;
#   - no registry: a pause image (test/kubernetes/pause) and ours
#     (make image) imported with ctr;
#   - certificates with openssl; kube-proxy (iptables mode, in the
#     cluster's network namespace) for the Services' cluster addresses:
#     the gateway's, and the API's that the gateway pods reach.
#
# Isolation: the whole cluster runs in a network namespace of its own
# (addresses in 198.18.0.0/16 only: node 198.18.3.1, pods 198.18.0.0/24,
# services 198.18.1.0/24, the daemon's sandboxes 198.18.2.0/24; a
# default route into a veth pair of its own, so nothing leaves it) and in a mount namespace of its own
# whose mounts are shared among themselves (the chart's Bidirectional
# mounts need that) but not with the host's. What is not namespaced — cgroups
# (under /sbx-k8s*), loop devices, the kernel sysctls the kubelet sets — is
# recorded before and restored or removed after, and the host is compared
# with what it was: links, routes, nftables and iptables, mounts, the
# top-level cgroups, those sysctls.
#
# Robust by construction: every wait is bounded and dumps diagnostics
# (kubectl describe, events, logs) on failure; the teardown runs from an
# EXIT trap whatever happens; a crashed earlier run's leftovers are removed
# before the host's state is recorded; the cluster part as a whole is
# bounded by KUBE_TEST_TIMEOUT (default 15m).
#
# Usage: scripts/test-kubernetes.sh            (root; after make build)
# KUBE_TEST_KEEP=1 leaves the cluster up for a look (teardown: rerun with
# argument "teardown"). KUBE_TEST_GATEWAYS sets the gateway replicas (2).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${KUBE_TEST_DIR:-/var/lib/sbx-k8s}
R=/run/sbx-k8s
NETNS=sbx-k8s
NODE_IP=198.18.3.1
NODE_NAME=sbx-k8s-node
KUBE_VERSION=${KUBE_VERSION:-v1.34.2}
PAUSE_IMAGE=registry.k8s.io/pause:3.10
IMAGE_TAG=k8s-test
GATEWAYS=${KUBE_TEST_GATEWAYS:-2}
SHARED_IMAGES=${SANDBOXD_TEST_IMAGES:-/var/tmp/mcp-sandboxd-test-images}
# mmdebstrap's base of the image, kept between runs beside the binaries.
IMAGE_CACHE=${KUBE_ASSETS_CACHE:-/var/cache/sandboxd-test/kube}/image-base
# Kernel settings the kubelet changes (not namespaced): restored at the end.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

log() { printf '%s test-kubernetes: %s\n' "$(date -u +%T)" "$*" >&2; }
die() {
	log "FAIL: $*"
	diagnostics
	exit 1
}

# diagnostics writes what a reader needs to see why, before teardown
# removes it, to $W/logs/diagnostics.txt, and shows its end.
diagnostics() {
	[[ -n ${KUBECONFIG:-} && -f ${KUBECONFIG:-} ]] || return 0
	{
		echo "## nodes, pods, services, endpoints"
		timeout 20 kubectl get nodes,pods,services,endpointslices -A -o wide
		echo "## describe"
		timeout 20 kubectl -n sandboxes describe daemonset,deployment,pods
		echo "## events"
		timeout 20 kubectl get events -A --sort-by=.lastTimestamp | tail -n 40
		echo "## node daemon logs"
		timeout 20 kubectl -n sandboxes logs -l app.kubernetes.io/component=node --all-containers --tail=60 --prefix
		echo "## gateway logs"
		timeout 20 kubectl -n sandboxes logs -l app.kubernetes.io/component=gateway --all-containers --tail=60 --prefix
		for f in kubelet kube-proxy containerd; do
			echo "## $f.log (errors, last 20)"
			grep -E '^E|level=error' "$W/logs/$f.log" 2>/dev/null | tail -n 20
		done
	} >"$W/logs/diagnostics.txt" 2>&1 || true
	tail -n 120 "$W/logs/diagnostics.txt" >&2
}

# hoststate prints what the cluster must leave as it found it. The root
# network namespace is compared whole (no test may touch it); mounts,
# cgroups and loop devices only where the cluster makes them, since other
# tests on the machine make and remove their own meanwhile.
hoststate() {
	echo "## links"; ip -o link show 2>/dev/null | sed 's/^[0-9]*: //; s/ state .*//' | sort
	echo "## routes"; ip route show table all | sort
	echo "## netns"; ip netns list | sort
	echo "## nftables"; nft list ruleset 2>/dev/null || true
	echo "## iptables"; iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' || true
	echo "## mounts"; awk '{print $5, $9}' /proc/self/mountinfo | grep -E "sbx-k8s|kubelet|containerd|/run/netns" | sort || true
	echo "## cgroups"; for h in /sys/fs/cgroup/*/; do ls "$h" | grep -E 'sbx-k8s|kubepods' | sed "s#^#$h#"; done | sort || true
	echo "## sysctls"; for s in "${SYSCTLS[@]}" net.ipv4.ip_forward; do echo "$s=$(sysctl -n "$s")"; done
	echo "## loop"; losetup -a | grep -E "sbx-k8s|mcp-sandboxd-test-images" | sort || true
}

teardown() {
	log "teardown"
	if ip netns pids "$NETNS" >/dev/null 2>&1; then
		for p in $(ip netns pids "$NETNS" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
	fi
	# Processes of the cluster outside the network namespace (the node
	# daemon's sandboxes share the host's PID namespace and sit in our
	# cgroups): kill whatever is left in them.
	for h in /sys/fs/cgroup/*/; do
		for d in "$h"sbx-k8s "$h"sbx-k8s-sandboxes; do
			[[ -d $d ]] || continue
			find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		done
	done
	# A cgroup can be removed once the kernel has reaped its killed
	# processes: retried, for at most 10 s (the host check reports what
	# is left after that).
	local left
	for ((i = 0; i < 20; i++)); do
		left=0
		for h in /sys/fs/cgroup/*/; do
			for d in "$h"sbx-k8s "$h"sbx-k8s-sandboxes; do
				if [[ -d $d ]]; then
					find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || left=1
				fi
			done
		done
		((left)) || break
		sleep 0.5
	done
	ip netns del "$NETNS" 2>/dev/null || true
	# Loop devices the node daemon attached for disk-backed sandboxes.
	losetup -a | awk -F: -v w="$W" 'index($0, w) {print $1}' | xargs -r -n1 losetup -d 2>/dev/null || true
	if [[ -f $W/sysctls.saved ]]; then
		while IFS='=' read -r k v; do sysctl -q -w "$k=$v" || true; done <"$W/sysctls.saved"
	fi
	rm -rf "$R"
	rm -rf "${W:?}"/{pki,etcd,containerd,kubelet,cni,cni-ipam,node-state,pod-logs,*.yaml,*.toml,*.conf,kubeconfig}
}

# ---------------------------------------------------------------- inside
# Runs in the cluster's network and mount namespaces.
inner() {
	export KUBECONFIG=$W/kubeconfig PATH=$BIN:$PATH
	mount --make-rshared /
	# containerd's CNI puts each pod's network namespace in /run/netns: a
	# tmpfs of this mount namespace, so that those files never appear in
	# the host's /run/netns (a failed run left them there) and vanish
	# with the namespace.
	mount -t tmpfs -o mode=0755 sbx-k8s-netns /run/netns
	ip link set lo up
	# The node's address on a veth pair whose both ends are in here (this
	# kernel has no dummy driver): a default route that leads nowhere.
	ip link add node0 type veth peer name node1
	ip addr add "$NODE_IP/32" dev node0
	ip link set node0 up
	ip link set node1 up
	ip route add default dev node0

	pki
	cat >"$KUBECONFIG" <<-EOF
		apiVersion: v1
		kind: Config
		clusters: [{name: k, cluster: {server: "https://$NODE_IP:6443", certificate-authority: $W/pki/ca.crt}}]
		users: [{name: admin, user: {client-certificate: $W/pki/admin.crt, client-key: $W/pki/admin.key}}]
		contexts: [{name: k, context: {cluster: k, user: admin}}]
		current-context: k
	EOF

	mkdir -p "$W/logs"
	"$BIN/etcd" --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster default=http://127.0.0.1:2380 >"$W/logs/etcd.log" 2>&1 &
	"$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 --advertise-address="$NODE_IP" --secure-port=6443 \
		--tls-cert-file="$W/pki/apiserver.crt" --tls-private-key-file="$W/pki/apiserver.key" --client-ca-file="$W/pki/ca.crt" \
		--kubelet-client-certificate="$W/pki/admin.crt" --kubelet-client-key="$W/pki/admin.key" \
		--service-account-key-file="$W/pki/sa.pub" --service-account-signing-key-file="$W/pki/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=198.18.1.0/24 \
		--authorization-mode=Node,RBAC --allow-privileged=true \
		--kubelet-preferred-address-types=InternalIP \
		>"$W/logs/kube-apiserver.log" 2>&1 &
	wait_for "kube-apiserver" 120 kubectl get --raw /readyz
	"$BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG" --leader-elect=false --bind-address=127.0.0.1 \
		--service-account-private-key-file="$W/pki/sa.key" --root-ca-file="$W/pki/ca.crt" \
		--use-service-account-credentials=false --allocate-node-cidrs=false \
		>"$W/logs/kube-controller-manager.log" 2>&1 &
	"$BIN/kube-scheduler" --kubeconfig="$KUBECONFIG" --leader-elect=false --bind-address=127.0.0.1 \
		>"$W/logs/kube-scheduler.log" 2>&1 &

	mkdir -p "$W/cni" "$W/containerd"
	cat >"$W/cni/10-sbx.conflist" <<-EOF
		{"cniVersion": "0.4.0", "name": "sbx-k8s", "plugins": [
		  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
		   "ipam": {"type": "host-local", "dataDir": "$W/cni-ipam", "ranges": [[{"subnet": "198.18.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
		  {"type": "portmap", "capabilities": {"portMappings": true}}]}
	EOF
	cat >"$W/containerd.toml" <<-EOF
		version = 2
		root = "$W/containerd/root"
		state = "$R/containerd"
		[grpc]
		  address = "$R/containerd.sock"
		[plugins."io.containerd.grpc.v1.cri"]
		  sandbox_image = "$PAUSE_IMAGE"
		  restrict_oom_score_adj = true
		  [plugins."io.containerd.grpc.v1.cri".cni]
		    bin_dir = "/usr/lib/cni"
		    conf_dir = "$W/cni"
		  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
		    runtime_type = "io.containerd.runc.v2"
		    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
		      SystemdCgroup = false
	EOF
	containerd -c "$W/containerd.toml" >"$W/logs/containerd.log" 2>&1 &
	wait_for containerd 60 ctr -a "$R/containerd.sock" version
	for img in "$W/pause.tar" "$IMAGE"; do
		ctr -a "$R/containerd.sock" -n k8s.io images import "$img" >/dev/null
	done
	# Not `| grep -q`: under pipefail its early exit fails ctr with SIGPIPE.
	images=$(ctr -a "$R/containerd.sock" -n k8s.io images ls -q)
	grep -qx "docker.io/library/mcp-sandboxd:$IMAGE_TAG" <<<"$images" ||
		die "ctr import did not name the image docker.io/library/mcp-sandboxd:$IMAGE_TAG"

	# The kubelet's cgroupRoot must exist in every hierarchy (teardown
	# removes it).
	for h in /sys/fs/cgroup/*/; do mkdir -p "${h}sbx-k8s"; done
	echo "nameserver 127.0.0.1" >"$W/resolv.conf"
	# No eviction: the machine's disk is shared with other work, and a
	# percentage of it free (1% of a big disk is gigabytes) evicted the
	# node daemon in the middle of a run. Every signal is given, so that
	# none takes its default.
	cat >"$W/kubelet.yaml" <<-EOF
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		cgroupDriver: cgroupfs
		failCgroupV1: false
		cgroupRoot: /sbx-k8s
		oomScoreAdj: 0
		containerRuntimeEndpoint: unix://$R/containerd.sock
		address: $NODE_IP
		readOnlyPort: 0
		healthzBindAddress: 127.0.0.1
		tlsCertFile: $W/pki/kubelet.crt
		tlsPrivateKeyFile: $W/pki/kubelet.key
		authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $W/pki/ca.crt}}
		authorization: {mode: AlwaysAllow}
		failSwapOn: false
		resolvConf: $W/resolv.conf
		podLogsDir: $W/pod-logs
		evictionHard: {memory.available: "1Mi", nodefs.available: "1Mi", imagefs.available: "1Mi", nodefs.inodesFree: "1", imagefs.inodesFree: "1"}
		imageGCHighThresholdPercent: 100
		imageGCLowThresholdPercent: 99
		protectKernelDefaults: false
	EOF
	"$BIN/kubelet" --config="$W/kubelet.yaml" --kubeconfig="$KUBECONFIG" --root-dir="$W/kubelet" \
		--hostname-override="$NODE_NAME" --node-ip="$NODE_IP" >"$W/logs/kubelet.log" 2>&1 &
	wait_for "node $NODE_NAME" 120 kubectl get node "$NODE_NAME"
	kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s >/dev/null || die "node not ready (logs in $W/logs)"
	# kube-proxy gives Services their cluster addresses in this namespace's
	# own iptables: the gateway's Service, which the checks go through, and
	# the API's (198.18.1.1), which the gateway pods' discovery uses. It
	# leaves the conntrack sysctls alone (maxPerCore 0, timeouts 0): some
	# are not per-namespace.
	cat >"$W/kube-proxy.yaml" <<-EOF
		apiVersion: kubeproxy.config.k8s.io/v1alpha1
		kind: KubeProxyConfiguration
		clientConnection: {kubeconfig: $KUBECONFIG}
		hostnameOverride: $NODE_NAME
		mode: iptables
		clusterCIDR: 198.18.0.0/24
		healthzBindAddress: 127.0.0.1:10256
		metricsBindAddress: 127.0.0.1:10249
		oomScoreAdj: 0
		conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
	EOF
	"$BIN/kube-proxy" --config="$W/kube-proxy.yaml" >"$W/logs/kube-proxy.log" 2>&1 &
	wait_for "kube-proxy" 60 curl -sf -m 2 http://127.0.0.1:10256/healthz
	log "cluster up"

	# The chart with its gateway Deployment ($GATEWAYS replicas): state
	# and cgroups of the node daemon where teardown finds them, the
	# language images from the shared test cache (no mirror is reachable
	# from this network namespace).
	mkdir -p "$W/node-state/images"
	mount --bind "$SHARED_IMAGES" "$W/node-state/images"
	# The admin key in the E2B SDKs' form (e2b_ and hex, which they
	# insist on), so that the one key drives REST, MCP and the E2B SDK
	# through the gateway (whose replicas share no tenants store here).
	helm install sbx "$ROOT/deploy/helm/mcp-sandboxd" --namespace sandboxes --create-namespace \
		--set image.tag="$IMAGE_TAG" --set gateway.replicas="$GATEWAYS" \
		--set adminKey.value="e2b_$(openssl rand -hex 24)" --set gateway.e2b.enabled=true \
		--set node.stateDir="$W/node-state" --set node.runDir="$R/node-run" \
		--set-json 'node.config={"sandbox":{"cgroup_parent":"/sbx-k8s-sandboxes","max_sandboxes":4},"network":{"subnet":"198.18.2.0/24"}}' \
		--wait --timeout 5m || die "helm install --wait"
	# helm's --wait counts a DaemonSet with no pod scheduled yet as ready:
	# wait for the daemon's pod itself.
	wait_for "a node daemon pod" 120 sh -c 'test -n "$(kubectl -n sandboxes get pods -l app.kubernetes.io/component=node -o name)"'
	kubectl -n sandboxes wait --for=condition=Ready pod -l app.kubernetes.io/component=node --timeout=300s >/dev/null ||
		die "the node daemon's pod is not ready"
	kubectl -n sandboxes rollout status deployment/sbx-mcp-sandboxd-gateway --timeout=180s >/dev/null ||
		die "the gateway's replicas are not ready"
	log "helm install: node daemon and $GATEWAYS gateway replicas ready"
	# The node daemons' PodDisruptionBudget is one the disruption
	# controller can compute over a DaemonSet (expected pods counted, an
	# eviction allowed with minAvailable 0): a maxUnavailable never syncs.
	wait_for "the node PodDisruptionBudget's status" 60 sh -c \
		'test "$(kubectl -n sandboxes get pdb sbx-mcp-sandboxd-node -o jsonpath="{.status.expectedPods}/{.status.disruptionsAllowed}")" = 1/1'

	# pkg/kubediscovery against this cluster's own EndpointSlice controller,
	# as the gateway's ServiceAccount (test/kubernetes, tag kubernetes).
	KUBE_TEST_SERVER=https://$NODE_IP:6443 KUBE_TEST_CA=$W/pki/ca.crt \
		KUBE_TEST_TOKEN=$(kubectl -n sandboxes create token sbx-mcp-sandboxd-gateway) \
		KUBE_TEST_NODE=$NODE_NAME KUBE_TEST_NODE_URL=http://$NODE_IP:7070 \
		"$W/kubernetes.test" -test.v -test.timeout 3m -test.run '^TestDiscoveryInCluster$' >"$W/logs/discovery.log" 2>&1 ||
		{ cat "$W/logs/discovery.log" >&2; die "discovery in the cluster"; }
	log "discovery in the cluster: $(grep -c ': ready\|: drained\|: undrained' "$W/logs/discovery.log") states seen as the gateway's ServiceAccount"

	# Everything from here goes through the gateway Service's cluster
	# address, which kube-proxy spreads over the replicas.
	ADMIN_TOKEN=$(kubectl -n sandboxes get secret sbx-mcp-sandboxd-admin -o jsonpath='{.data.token}' | base64 -d)
	gwip=$(kubectl -n sandboxes get service sbx-mcp-sandboxd-gateway -o jsonpath='{.spec.clusterIP}')
	GATEWAY_URL=http://$gwip:80
	E2B_URL=http://$gwip:$(kubectl -n sandboxes get service sbx-mcp-sandboxd-gateway -o jsonpath='{.spec.ports[?(@.name=="e2b")].port}')
	export ADMIN_TOKEN GATEWAY_URL E2B_URL
	[[ $(kubectl -n sandboxes get service sbx-mcp-sandboxd-gateway -o jsonpath='{.spec.sessionAffinity}') == ClientIP ]] ||
		die "the gateway Service has no ClientIP session affinity (MCP sessions live in one replica)"
	# Ready replicas answer once discovery has listed the node daemon.
	wait_for "the node daemon through the gateway" 60 curl -sf -m 5 "$GATEWAY_URL/v1/nodes" -H "Authorization: Bearer $ADMIN_TOKEN"
	gwtest TestGatewayServes
	log "through the gateway $GATEWAY_URL: create, streamed exec, files, terminal, list"

	# Clients through the gateway (issue 26), each a phase of
	# test/kubernetes against $GATEWAY_URL / $E2B_URL with $ADMIN_TOKEN
	# that runs an official SDK from test/mcp or test/e2b (their
	# node_modules, installed by scripts/install-deps.sh; nothing is
	# installed here) and checks its report: MCP run_code of Python over
	# Streamable HTTP, and the E2B SDK's create, commands.run and files.
	# Another client: a Test function there and a gwtest line here.
	gwtest TestGatewayMCP
	log "MCP through the gateway: $(grep -o 'sandbox_create [0-9]* ms, run_code [0-9]* ms' "$W/logs/TestGatewayMCP.log")"
	gwtest TestGatewayE2B
	log "E2B SDK through the gateway $E2B_URL: create, commands.run (streamed), files, list, kill"

	# The node daemon's pod is deleted: the DaemonSet starts another, which
	# adopts the sandbox; through the gateway it keeps its files and works.
	old=$(kubectl -n sandboxes get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}')
	kubectl -n sandboxes delete pod "$old" --wait=true --timeout=120s >/dev/null || die "kubectl delete pod $old"
	kubectl -n sandboxes rollout status daemonset/sbx-mcp-sandboxd-node --timeout=180s >/dev/null || die "no new node daemon"
	kubectl -n sandboxes wait --for=condition=Ready pod -l app.kubernetes.io/component=node --timeout=180s >/dev/null ||
		die "the new node daemon's pod is not ready"
	new=$(kubectl -n sandboxes get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[*].metadata.name}')
	[[ -n $new && $new != "$old" && $new != *" "* ]] || die "node daemon pods after the delete: '$new' (was $old)"
	gwtest TestGatewayAfterAdoption
	log "sandbox adopted by the new pod $new (was $old): exec, file and terminal through the gateway, then terminated"

	helm uninstall sbx --namespace sandboxes --wait --timeout 2m >/dev/null || die "helm uninstall"
	# The node daemon's pod is gone only once its processes are.
	wait_for "the pods' end" 120 sh -c 'test -z "$(kubectl -n sandboxes get pods -o name)"'
	log "helm uninstall done"
}

# gwtest NAME: one phase of test/kubernetes's checks through the gateway.
gwtest() {
	KUBE_TEST_GATEWAY_URL=$GATEWAY_URL KUBE_TEST_ADMIN_TOKEN=$ADMIN_TOKEN KUBE_TEST_NODE=$NODE_NAME \
		KUBE_TEST_STATE=$W/gateway-test.state KUBE_TEST_E2B_URL=$E2B_URL \
		KUBE_TEST_NODE_URL=http://$NODE_IP:7070 KUBE_TEST_REPO=$ROOT \
		"$W/kubernetes.test" -test.v -test.timeout 4m -test.run "^$1\$" >"$W/logs/$1.log" 2>&1 ||
		{ cat "$W/logs/$1.log" >&2; die "$1"; }
	grep -E '^\s+gateway_test.go' "$W/logs/$1.log" >&2 || true
}

pki() {
	local p=$W/pki
	mkdir -p "$p"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" -days 1 -subj /CN=sbx-k8s-ca 2>/dev/null
	cert() { # name subject SANs
		openssl req -newkey rsa:2048 -nodes -keyout "$p/$1.key" -out "$p/$1.csr" -subj "$2" 2>/dev/null
		printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$p/$1.ext"
		openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -out "$p/$1.crt" -days 1 -extfile "$p/$1.ext" 2>/dev/null
	}
	cert apiserver /CN=kube-apiserver "IP:$NODE_IP,IP:127.0.0.1,IP:198.18.1.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
	cert admin "/O=system:masters/CN=admin" "DNS:admin"
	cert kubelet "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
	openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
	openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
	local what=$1 secs=$2
	shift 2
	for ((i = 0; i < secs * 2; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "$what not up after ${secs}s (logs in $W/logs)"
}

# ---------------------------------------------------------------- outside
case "${1:-}" in
inner)
	inner
	exit
	;;
teardown)
	teardown
	exit
	;;
diagnostics)
	# From outside, when the inner part did not dump them itself (it was
	# timed out or killed): in the cluster's network namespace.
	export KUBECONFIG=$W/kubeconfig PATH=$BIN:$PATH
	diagnostics
	exit
	;;
esac

[[ $(id -u) == 0 ]] || die "needs root"
start=$SECONDS
# What a crashed or killed earlier run left (its processes, cgroups,
# network namespace, loop devices, changed sysctls): removed before
# anything else, so that this run starts from, and compares against, a
# clean host. A failed run's logs and markers go too: they would be read
# as this run's.
teardown 2>/dev/null
rm -rf "${W:?}/logs" "$W/timed-out" "$W/gateway-test.state" "$W/host.before" "$W/host.after"
if ! command -v containerd >/dev/null || [[ ! -x /usr/lib/cni/bridge ]] || ! command -v iptables >/dev/null; then
	# Debian's containerd 1.6 and CNI plugins (no service is started where
	# systemd is not PID 1; this script starts its own containerd), and
	# iptables, which kube-proxy runs.
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends containerd containernetworking-plugins iptables >/dev/null
fi
BIN=$(KUBE_ASSETS_ALL=1 "$ROOT/scripts/kube-assets.sh" | tail -n1)
export BIN
[[ -x $ROOT/bin/mcp-sandboxd ]] || die "run make build first"
[[ -d $SHARED_IMAGES ]] || die "no shared image cache $SHARED_IMAGES (make test builds it)"
for sdk in test/mcp/node_modules/@modelcontextprotocol/sdk test/e2b/node_modules/e2b; do
	[[ -d $ROOT/$sdk ]] || die "no $sdk: run scripts/install-deps.sh"
done
mkdir -p "$W"
IMAGE=$W/mcp-sandboxd-image.tar
# The image, the pause image and the test binary: independent, built side
# by side (the image is mostly I/O, the two builds mostly CPU).
(cd "$ROOT" && go run ./deploy/image -bin bin -out "$IMAGE" -name "mcp-sandboxd:$IMAGE_TAG" -cache "$IMAGE_CACHE" >&2) &
image_pid=$!
(cd "$ROOT" && go test -c -tags kubernetes -o "$W/kubernetes.test" ./test/kubernetes) &
test_pid=$!
CGO_ENABLED=0 go build -C "$ROOT" -o "$W/pause" ./test/kubernetes/pause
(cd "$ROOT" && go run ./deploy/image -pause "$W/pause" -out "$W/pause.tar" -name "$PAUSE_IMAGE")
wait "$image_pid" || die "the daemon's image (deploy/image)"
wait "$test_pid" || die "go test -c ./test/kubernetes"
export IMAGE
log "assets ready after $((SECONDS - start))s"

hoststate >"$W/host.before"
for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$W/sysctls.saved"
rc=0
# watchdog bounds the cluster part by KUBE_TEST_TIMEOUT (seconds, or
# minutes with an m; default 15m). It waits on a pipe that only this
# script holds open: EOF, when the script ends or is killed (even with
# SIGKILL), ends the watchdog, so that no stale one outlives its run. On
# expiry it dumps the diagnostics while the cluster is still up, then
# kills the cluster's processes (those in its network namespace, the
# inner part among them); finish tears down the rest.
watchdog() {
	local t=${KUBE_TEST_TIMEOUT:-15m}
	[[ $t == *m ]] && t=$((${t%m} * 60))
	t=${t%s}
	local got=0
	read -r -t "$t" _ || got=$?
	((got > 128)) || return 0 # EOF (or a line): the run is over
	log "FAIL: the cluster part did not end within ${KUBE_TEST_TIMEOUT:-15m}"
	touch "$W/timed-out"
	nsenter --net="/run/netns/$NETNS" "$0" diagnostics || true
	for p in $(ip netns pids "$NETNS" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
}
# finish always runs (EXIT trap): a failure, a timeout or a signal still
# tears the cluster down and compares the host with what it was.
finish() {
	trap - EXIT INT TERM
	if [[ -n ${watchdog_fd:-} ]]; then
		exec {watchdog_fd}>&- # the watchdog reads EOF and ends
	fi
	if [[ ${KUBE_TEST_KEEP:-} == 1 ]]; then
		log "cluster kept (KUBE_TEST_KEEP=1): $0 teardown removes it"
		exit "$rc"
	fi
	teardown
	hoststate >"$W/host.after"
	if ! diff -u "$W/host.before" "$W/host.after" >&2; then
		log "FAIL: the host is not as it was (above)"
		rc=1
	fi
	rm -f "$W/sysctls.saved"
	if ((rc == 0)); then
		rm -rf "$W"
	else
		log "logs kept in $W/logs"
	fi
	log "done in $((SECONDS - start))s, rc=$rc"
	exit "$rc"
}
trap finish EXIT
trap 'rc=130; exit 130' INT TERM
ip netns add "$NETNS"
# nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup
# hierarchies the kubelet and containerd need. --propagation private cuts
# every peer link with the host's mounts first; inner() then makes them
# shared among the cluster's own. The whole of it is bounded by the
# watchdog below; the inner part does not hold the watchdog's pipe.
exec {watchdog_fd}> >(watchdog)
nsenter --net="/run/netns/$NETNS" unshare --mount --propagation private -- "$0" inner {watchdog_fd}>&- || rc=$?
if [[ -f $W/timed-out ]]; then
	rc=124
fi
