#!/usr/bin/env bash
# The kubelet node (sourced by hack/cluster): `node build|up|down|import|pid`.

# --- node ------------------------------------------------------------------
# `hack/cluster node up` adds one kubelet node to the control plane, on this
# machine, so that Pods (a Helm chart's) run: containerd, runc and the CNI
# bridge, with everything (containerd's root, state and sockets, the
# kubelet's root, logs, CNI configuration and addresses, certificates) under
# $STATE/node. `node down` (and `down`) undoes every change to the machine.
#
# No packet may leave the machine. The API server listens on 127.0.0.1 only,
# and without kube-proxy nothing would stop a Pod's traffic to a Service
# address from taking the default route. So, before any Pod starts:
#   - the whole Service range is a local route (`ip route add local`): an
#     address nobody redirects is refused on this machine;
#   - traffic from the Pod bridge to the `kubernetes` Service ($SERVICE_IP:443)
#     is DNATed to the API server's 127.0.0.1 port (route_localnet=1, on the
#     bridge only, lets it be routed there);
#   - traffic that enters from the Pod bridge and would leave by another
#     interface (or the reverse) is dropped; the bridge does no masquerading.
# kube-proxy (iptables mode) serves the other Services, whose endpoints are
# Pods on the bridge, masquerading every service packet so that replies come
# back through the host; the `kubernetes` Service has no endpoints (the API
# server listens on loopback and reconciles none), so the DNAT rule serves
# it. Pods on the host network would need a DNAT in OUTPUT too, which would
# redirect every process of the host: not done, such a Pod's connection to
# the `kubernetes` Service is refused (locally). `down` runs
# `kube-proxy --cleanup` and removes KUBE-FIREWALL if kube-proxy made it.
#
# The container runtime is containerd built from its Go module at a pinned
# release (CGO off, like the Kubernetes binaries) rather than Debian's 1.6:
# containerd 1.x is past the end of its support by the kubelet, and only 2.x
# can keep its network namespace mounts (netns_mounts_under_state_dir) and
# shim sockets (socket_dir) out of /run. runc comes from Debian; the CNI
# plugins (bridge, host-local, loopback) are built from their Go module.
# The sandbox ("pause") image is built offline: hack/pause.c, static, in an
# OCI archive that hack/oci-archive writes (hack/pause.Dockerfile).
#
# One node per machine: the Service range's local route (and the kubelet's
# device plugin socket) are the machine's; `node up` refuses to start when
# that route exists already.

CONTAINERD_VERSION=2.4.2
CNI_PLUGINS_VERSION=v1.9.1
CNI_BIN="$CACHE/cni-$CNI_PLUGINS_VERSION"
NODE_NAME=copyrator-node
# The Pods' addresses: on the node's bridge only (no route elsewhere).
POD_SUBNET=10.244.0.0/24
PAUSE_IMAGE=copyrator.local/pause:1
NODE_DIR="$STATE/node"
# Names on the machine carry the state directory's hash: this node's only.
STATE_ID=$(printf '%s' "$STATE" | md5sum | cut -c1-8)
BRIDGE="cpy$STATE_ID"
CHAIN="CPY-$STATE_ID"
CNI_NETWORK="copyrator-$STATE_ID"
CONTAINERD_SOCK="$NODE_DIR/containerd.sock"
# Sysctls that the node's parts set (the bridge plugin: ip_forward; the
# kubelet: its kernel tunables); `node down` puts back the values from before.
NODE_SYSCTLS="net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic
  kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max"
# Directories of the machine that the parts create when missing: containerd's
# CNI library caches results in /var/lib/cni, the kubelet links container
# logs in /var/log/containers and its device plugin manager listens in
# /var/lib/kubelet/device-plugins (none of these paths can be configured),
# mount(8) keeps its lock in /run/mount. Children first.
NODE_HOST_DIRS="/var/lib/cni/results /var/lib/cni /var/log/containers
  /var/lib/kubelet/device-plugins /var/lib/kubelet /run/mount"

need_debian_file() { # file package
  [ -e "$1" ] && return 0
  log "installing Debian package $2"
  [ "$(id -u)" = 0 ] || die "$1 is missing; install the Debian package $2"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"; } >&2 \
    || die "could not install $2"
}

build_containerd() {
  local mod=github.com/containerd/containerd/v2 started=$SECONDS
  log "building containerd v$CONTAINERD_VERSION (takes a few minutes once)"
  GOBIN="$BIN" go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X $mod/version.Version=v$CONTAINERD_VERSION" \
    "$mod/cmd/containerd@v$CONTAINERD_VERSION" \
    "$mod/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION" \
    "$mod/cmd/ctr@v$CONTAINERD_VERSION" >&2 || die "building containerd v$CONTAINERD_VERSION failed"
  log "built containerd in $((SECONDS - started)) s"
}

# The CNI plugins the node uses, from their Go module at a pinned release.
build_cni() {
  local mod=github.com/containernetworking/plugins started=$SECONDS
  log "building the CNI plugins $CNI_PLUGINS_VERSION (bridge, host-local, loopback)"
  mkdir -p "$CNI_BIN"
  CGO_ENABLED=0 GOBIN="$CNI_BIN" go install -trimpath -ldflags "-s -w" \
    "$mod/plugins/main/bridge@$CNI_PLUGINS_VERSION" \
    "$mod/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
    "$mod/plugins/main/loopback@$CNI_PLUGINS_VERSION" >&2 ||
    die "building the CNI plugins $CNI_PLUGINS_VERSION failed"
  log "built the CNI plugins in $((SECONDS - started)) s"
}

cmd_node_build() {
  [ "$(id -u)" = 0 ] || die "a node needs root (containers, bridge, iptables)"
  cmd_build
  need_debian_package runc runc
  need_debian_package gcc gcc
  need_debian_file "$(gcc -print-file-name=libc.a)" libc6-dev
  need_debian_package iptables iptables
  need_debian_package ip iproute2
  need_debian_package nsenter util-linux
  go_env
  if ! "$BIN/containerd" --version 2>/dev/null | grep -q " v$CONTAINERD_VERSION\b" ||
    [ ! -x "$BIN/containerd-shim-runc-v2" ] || [ ! -x "$BIN/ctr" ]; then
    build_containerd
  fi
  if [ ! -x "$CNI_BIN/bridge" ] || [ ! -x "$CNI_BIN/host-local" ] || [ ! -x "$CNI_BIN/loopback" ]; then
    build_cni
  fi
}

# The address of the interface of the default route (else the first global
# one): the node's InternalIP. Traffic to it stays on this machine.
host_ip() {
  local dev
  dev=$(ip -4 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}')
  { [ -n "$dev" ] && ip -4 -o addr show dev "$dev" scope global; ip -4 -o addr show scope global; } |
    awk -v br="$BRIDGE" '$2 != br { sub(/\/.*/, "", $4); print $4; exit }'
}

# ctr, without the warning it prints on every call on a cgroup v1 host.
ctr_() {
  "$BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io "$@" \
    2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2)
}

kubectl_() { "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

node_ready() {
  [ "$(kubectl_ get node "$NODE_NAME" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# The shim socket directory: under the state directory when its path is
# short enough for containerd (42 characters), else a short one in /run.
shim_socket_dir() {
  if [ ${#NODE_DIR} -le 40 ]; then echo "$NODE_DIR/s"; else echo "/run/copyrator-$STATE_ID"; fi
}

# Our chains, each hooked first into a built-in chain: table chain hook.
node_chains() {
  echo "filter $CHAIN-FWD FORWARD"
  echo "filter $CHAIN-IN INPUT"
  echo "nat $CHAIN-DNAT PREROUTING"
}

# What the machine looked like before: restored or compared against on down.
node_record_before() {
  local u="$NODE_DIR/before" key dir cmd
  mkdir -p "$u"
  for key in $NODE_SYSCTLS; do echo "$key $(sysctl -n "$key")"; done >"$u/sysctls"
  for dir in $NODE_HOST_DIRS; do [ -e "$dir" ] && echo "$dir"; done >"$u/dirs" || true
  nft list tables 2>/dev/null >"$u/nft-tables" || true
  # kube-proxy makes KUBE-FIREWALL (the kubelet's chain) when it is missing,
  # and its --cleanup leaves it: ours to remove if it was not there before.
  for cmd in iptables ip6tables; do
    "$cmd" -w -S KUBE-FIREWALL >/dev/null 2>&1 && echo "$cmd"
  done >"$u/kube-firewall" || true
  k8s_io_cgroups >"$u/cgroups"
}

# The cgroups in which containerd puts containers, in every hierarchy.
k8s_io_cgroups() {
  local top
  for top in /sys/fs/cgroup/*/k8s.io; do
    [ -d "$top" ] && find "$top" -type d
  done
  return 0
}

# Another node (or anything else) must not own the routes a node adds.
node_network_free() {
  if [ -n "$(ip route show table local "$SERVICE_RANGE")" ]; then
    die "the Service range $SERVICE_RANGE is a local route already (another node on this machine?)"
  fi
  if [ -n "$(ip -4 route show "$POD_SUBNET")" ]; then
    die "the Pod subnet $POD_SUBNET is routed already (another node on this machine?)"
  fi
}

node_network_up() { # api-port
  ip route add local "$SERVICE_RANGE" dev lo table local
  # From here on the route and the sysctls are ours to undo.
  touch "$NODE_DIR/before/network"
  ip link add name "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  local table chain hook
  while read -r table chain hook; do
    iptables -w -t "$table" -N "$chain"
    iptables -w -t "$table" -I "$hook" 1 -j "$chain"
  done < <(node_chains)
  iptables -w -A "$CHAIN-FWD" -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  iptables -w -A "$CHAIN-FWD" -o "$BRIDGE" ! -i "$BRIDGE" -j DROP
  # Only the DNATed Service traffic may reach a loopback address.
  iptables -w -A "$CHAIN-IN" -i "$BRIDGE" -d 127.0.0.0/8 -m conntrack ! --ctstate DNAT -j DROP
  iptables -w -t nat -A "$CHAIN-DNAT" -i "$BRIDGE" -d "$SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "127.0.0.1:$1"
}

write_node_config() { # node-ip kubelet-port healthz-port shim-socket-dir proxy-healthz-port proxy-metrics-port
  local pki="$STATE/pki" c="$NODE_DIR/containerd"
  mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam" "$c" "$NODE_DIR/pod-logs"
  cat >"$NODE_DIR/cni/net.d/10-copyrator.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NODE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
  # Plugins that would write outside the state directory are disabled: NRI
  # (/var/run/nri), opt (/opt/containerd), the image verifier; no imports
  # from /etc/containerd, no CDI specs from /etc/cdi.
  cat >"$c/config.toml" <<EOF
version = 4
root = '$c/root'
state = '$c/state'
temp = '$c/tmp'
imports = []
oom_score = 0
disabled_plugins = [
  'io.containerd.nri.v1.nri',
  'io.containerd.internal.v1.opt',
  'io.containerd.image-verifier.v1.bindir',
  'io.containerd.snapshotter.v1.blockfile',
  'io.containerd.snapshotter.v1.erofs',
  'io.containerd.differ.v1.erofs',
  'io.containerd.tracing.processor.v1.otlp',
  'io.containerd.internal.v1.tracing',
]

[plugins.'io.containerd.server.v1.grpc']
  address = '$CONTAINERD_SOCK'
[plugins.'io.containerd.server.v1.ttrpc']
  address = '$CONTAINERD_SOCK.ttrpc'
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = '$4'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '$PAUSE_IMAGE'

[plugins.'io.containerd.cri.v1.runtime']
  # Root here may not lower an OOM score: without this runc fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      runtime_path = '$BIN/containerd-shim-runc-v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$(command -v runc)'
        Root = '$c/runc'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$CNI_BIN']
    conf_dir = '$NODE_DIR/cni/net.d'
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
EOF
  # The kubelet: cgroupfs and no QoS cgroups (hybrid cgroup v1, no systemd
  # here); no iptables chains of its own (they serve kube-proxy only); no DNS
  # for Pods (no cluster DNS, and the host's resolver is not theirs to use);
  # image garbage collection off and eviction thresholds low: the disk of a
  # development machine is often fuller than the kubelet's defaults allow.
  # kube-proxy serves the Services whose endpoints are Pods (a `helm test`
  # Pod reaching the operator's metrics Service, say). The `kubernetes`
  # Service has no endpoints here (the API server listens on loopback and
  # reconciles none): the DNAT rule above serves it. Every service packet is
  # masqueraded to the bridge's address, so replies between Pods on the one
  # bridge come back through the host (no br_netfilter needed); conntrack
  # sysctls and localhost NodePorts (route_localnet) are left alone.
  cat >"$NODE_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $NODE_DIR/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$5
metricsBindAddress: 127.0.0.1:$6
clusterCIDR: $POD_SUBNET
nodePortAddresses: ["$1/32"]
iptables:
  masqueradeAll: true
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF
  cat >"$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $1
port: $2
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $3
tlsCertFile: $pki/node-serving.crt
tlsPrivateKeyFile: $pki/node-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
makeIPTablesUtilChains: false
oomScoreAdj: 0
podLogsDir: $NODE_DIR/pod-logs
resolvConf: ""
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 256Mi
  nodefs.inodesFree: "1%"
  imagefs.available: 256Mi
  imagefs.inodesFree: "1%"
EOF
}

start_containerd() {
  start containerd "$BIN/containerd" --config "$NODE_DIR/containerd/config.toml"
}

containerd_ready_or_dead() {
  alive containerd || return 0
  ctr_ version >/dev/null 2>&1
}

start_kubelet() {
  start kubelet "$BIN/kubelet" --config="$NODE_DIR/kubelet.yaml" \
    --kubeconfig="$NODE_DIR/kubelet.kubeconfig" --root-dir="$NODE_DIR/kubelet" \
    --cert-dir="$NODE_DIR/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$(cat "$NODE_DIR/node-ip")"
}

node_ready_or_dead() { ! alive kubelet || node_ready; }

start_kube_proxy() {
  start kube-proxy "$BIN/kube-proxy" --config="$NODE_DIR/kube-proxy.yaml"
}

# kube-proxy has written its rules: its service chain exists.
kube_proxy_synced_or_dead() {
  alive kube-proxy || return 0
  iptables -w -t nat -S KUBE-SERVICES >/dev/null 2>&1
}

# Imports an OCI or Docker image archive into the node's runtime, where Pods
# with imagePullPolicy Never (or IfNotPresent) find it.
cmd_node_import() { # file
  [ -f "$1" ] || die "no such file: $1"
  alive containerd || die "no node running in $STATE; run: hack/cluster node up"
  ctr_ images import --platform linux/amd64 "$1" >&2 || die "could not import $1"
}

# The host PID of a running container's first process (for tests that look
# at the process itself: its user, its mounts).
cmd_node_pid() { # container id
  alive containerd || die "no node running in $STATE"
  ctr_ tasks ls | awk -v id="$1" '$1 == id { print $2; found = 1 } END { exit !found }' ||
    die "no running task $1"
}

# A Pod of the pause image reaches Running, and from its network the
# `kubernetes` Service answers while another Service address is refused
# locally.
node_smoke() {
  local pod=copyrator-node-smoke started=$SECONDS id pid answer
  kubectl_ -n default delete pod "$pod" --ignore-not-found --wait=true >/dev/null 2>&1 || true
  kubectl_ -n default apply -f - >/dev/null <<EOF || die "smoke: could not create Pod $pod"
apiVersion: v1
kind: Pod
metadata:
  name: $pod
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: pause
    image: $PAUSE_IMAGE
    imagePullPolicy: Never
EOF
  if ! kubectl_ -n default wait pod "$pod" --for=jsonpath='{.status.phase}'=Running --timeout=90s >/dev/null; then
    kubectl_ -n default describe pod "$pod" >&2 || true
    die "smoke: Pod $pod did not reach Running"
  fi
  log "smoke: Pod $pod Running $((SECONDS - started)) s after its creation"
  id=$(kubectl_ -n default get pod "$pod" -o 'jsonpath={.status.containerStatuses[0].containerID}')
  id=${id#containerd://}
  pid=$(ctr_ tasks ls | awk -v id="$id" '$1 == id { print $2 }')
  [ -n "$pid" ] || die "smoke: no task for container $id"
  [ -n "$(ip route show table local "$SERVICE_RANGE")" ] || die "smoke: the local Service route is gone"
  answer=$(nsenter -t "$pid" -n curl -sSk --max-time 5 "https://$SERVICE_IP/readyz" 2>&1) ||
    die "smoke: from the Pod's network, https://$SERVICE_IP/readyz: $answer"
  log "smoke: from the Pod's network, https://$SERVICE_IP:443/readyz answers: $answer"
  if answer=$(nsenter -t "$pid" -n curl -sS --max-time 3 "http://${SERVICE_IP%.*}.2/" 2>&1); then
    die "smoke: an unredirected Service address answered: $answer"
  fi
  log "smoke: an unredirected Service address is refused locally (${answer##*: })"
  kubectl_ -n default delete pod "$pod" --wait=true --timeout=30s >/dev/null ||
    die "smoke: could not delete Pod $pod"
}

cmd_node_up() {
  local started=$SECONDS node_ip kubelet_port healthz_port proxy_healthz_port proxy_metrics_port sockdir
  api_ready || die "no running control plane in $STATE; run: hack/cluster up"
  ! is_member || die "the control plane in $STATE is a member one, which has no node"
  if alive containerd && alive kubelet && node_ready; then
    log "reusing the node $NODE_NAME in $STATE"
    return 0
  fi
  # A node half up (or down half done) is taken down first.
  cmd_node_down
  cmd_node_build
  node_network_free
  node_ip=$(host_ip)
  [ -n "$node_ip" ] || die "no non-loopback IPv4 address on this machine for the node"
  read -r kubelet_port healthz_port proxy_healthz_port proxy_metrics_port <<<"$(free_ports 4)"
  sockdir=$(shim_socket_dir)
  mkdir -p "$NODE_DIR" "$sockdir"
  echo "$node_ip" >"$NODE_DIR/node-ip"
  node_record_before
  node_network_up "$(cat "$STATE/api.port")"

  cert node-client "/O=system:nodes/CN=system:node:$NODE_NAME"
  cert node-serving "/CN=system:node:$NODE_NAME" "subjectAltName=IP:$node_ip,DNS:$NODE_NAME
extendedKeyUsage=serverAuth"
  write_kubeconfig "$NODE_DIR/kubelet.kubeconfig" node-client
  cert kube-proxy "/CN=system:kube-proxy"
  write_kubeconfig "$NODE_DIR/kube-proxy.kubeconfig" kube-proxy
  write_node_config "$node_ip" "$kubelet_port" "$healthz_port" "$sockdir" \
    "$proxy_healthz_port" "$proxy_metrics_port"

  # The sandbox image, built offline.
  gcc -static -Os -s -o "$NODE_DIR/pause" "$HACK/pause.c" || die "could not build hack/pause.c"
  python3 "$HACK/oci-archive" --dockerfile "$HACK/pause.Dockerfile" --context "$NODE_DIR" \
    --tag "$PAUSE_IMAGE" --out "$NODE_DIR/pause.tar" >&2 ||
    die "could not write the pause image"

  start_containerd
  if ! wait_for 30 containerd_ready_or_dead || ! alive containerd; then
    tail -n 5 "$STATE/containerd.log" >&2 || true
    die "containerd did not start; see $STATE/containerd.log"
  fi
  log "containerd ready"
  ctr_ images import --platform linux/amd64 "$NODE_DIR/pause.tar" >/dev/null ||
    die "could not import the pause image"

  start_kubelet
  if ! wait_for 120 node_ready_or_dead || ! alive kubelet; then
    tail -n 10 "$STATE/kubelet.log" >&2 || true
    die "the node did not become Ready; see $STATE/kubelet.log"
  fi
  log "node $NODE_NAME ($node_ip) Ready $((SECONDS - started)) s after node up started (builds included)"
  start_kube_proxy
  if ! wait_for 30 kube_proxy_synced_or_dead || ! alive kube-proxy; then
    tail -n 10 "$STATE/kube-proxy.log" >&2 || true
    die "kube-proxy did not start; see $STATE/kube-proxy.log"
  fi
  log "kube-proxy ready"
  node_smoke
  log "node up done in $((SECONDS - started)) s"
}

# Kills (TERM, then KILL after the wait) a process we started, by its PID,
# if it still runs the given binary.
stop_pid() { # pid binary seconds
  local argv0
  argv0=$({ tr '\0' '\n' <"/proc/$1/cmdline"; } 2>/dev/null | head -n1) || return 0
  [ "$argv0" = "$2" ] || return 0
  kill -TERM "$1" 2>/dev/null || true
  local deadline=$((SECONDS + $3))
  while [ -e "/proc/$1" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}

# Our cgroups (those created since node up), deepest first.
node_cgroups() {
  k8s_io_cgroups | grep -vxF -f "$NODE_DIR/before/cgroups" 2>/dev/null | sort -r
  return 0
}

# Mount points under a directory, deepest first.
mounts_under() { # dir
  awk -v d="$1/" '{ p = $5; gsub(/\\040/, " ", p); if (index(p "/", d) == 1) print p }' /proc/self/mountinfo |
    sort -r
}

cmd_node_down() {
  [ -d "$NODE_DIR" ] || return 0
  log "stopping the node $NODE_NAME"
  local id pid f table chain hook key value dir sockdir deadline left cmd
  sockdir=$(shim_socket_dir)
  # 1. Drain through the API while the kubelet runs: it stops every Pod
  #    (and the CNI plugin releases its network) as a deletion would.
  if alive kubelet && api_ready; then
    kubectl_ cordon "$NODE_NAME" >/dev/null 2>&1 || true
    kubectl_ delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=10 \
      --wait=false >/dev/null 2>&1 || true
    deadline=$((SECONDS + 45))
    while [ "$SECONDS" -lt "$deadline" ] && [ -n "$(ctr_ tasks ls -q 2>/dev/null)" ]; do sleep 0.5; done
  fi
  stop kubelet 15
  stop kube-proxy 10
  # kube-proxy's own chains (iptables and nftables), as it removes them.
  if [ -f "$NODE_DIR/kube-proxy.yaml" ]; then
    "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || log "kube-proxy --cleanup failed"
  fi
  if [ -f "$NODE_DIR/before/kube-firewall" ]; then
    for cmd in iptables ip6tables; do
      grep -qxF "$cmd" "$NODE_DIR/before/kube-firewall" && continue
      for hook in INPUT OUTPUT FORWARD; do
        while "$cmd" -w -D "$hook" -j KUBE-FIREWALL 2>/dev/null; do :; done
      done
      "$cmd" -w -F KUBE-FIREWALL 2>/dev/null || true
      "$cmd" -w -X KUBE-FIREWALL 2>/dev/null || true
    done
  fi
  # 2. What is left runs without the kubelet: kill and delete every task.
  if alive containerd; then
    for id in $(ctr_ tasks ls -q 2>/dev/null); do
      ctr_ tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr_ tasks ls -q 2>/dev/null); do
      deadline=$((SECONDS + 10))
      until ctr_ tasks delete -f "$id" >/dev/null 2>&1 || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.2; done
    done
  fi
  stop containerd 10
  # 3. Shims that outlived containerd, by the PIDs they recorded.
  for f in "$NODE_DIR"/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
    [ -f "$f" ] && stop_pid "$(cat "$f")" "$BIN/containerd-shim-runc-v2" 5
  done
  # 4. Processes left in our containers' cgroups.
  for dir in $(node_cgroups); do
    # shellcheck disable=SC2013 # one PID a line: the words are the lines
    for pid in $(cat "$dir/cgroup.procs" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  # 5. Mounts: the kubelet's root (bound on itself), volumes, root file
  #    systems, network namespaces. A busy one is detached (lazy).
  for dir in $(mounts_under "$NODE_DIR") $(mounts_under "$sockdir"); do
    umount "$dir" 2>/dev/null || umount -l "$dir" 2>/dev/null || log "could not unmount $dir"
  done
  # 6. Our (by now empty) cgroups.
  for _ in 1 2 3 4 5; do
    left=0
    for dir in $(node_cgroups); do rmdir "$dir" 2>/dev/null || left=1; done
    [ "$left" = 0 ] && break
    sleep 0.5
  done
  for dir in $(node_cgroups); do log "could not remove the cgroup $dir"; done
  # 7. Network: veths left on the bridge, the bridge, our chains, the route.
  for dir in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
    ip link del "$dir" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  while read -r table chain hook; do
    while iptables -w -t "$table" -D "$hook" -j "$chain" 2>/dev/null; do :; done
    iptables -w -t "$table" -F "$chain" 2>/dev/null || true
    iptables -w -t "$table" -X "$chain" 2>/dev/null || true
  done < <(node_chains)
  if [ -f "$NODE_DIR/before/network" ]; then
    ip route del local "$SERVICE_RANGE" dev lo table local 2>/dev/null || true
  fi
  # Tables of nftables that iptables created for us and that are empty now.
  if [ -f "$NODE_DIR/before/nft-tables" ] && command -v nft >/dev/null; then
    nft list tables 2>/dev/null | while read -r _ family table; do
      grep -qxF "table $family $table" "$NODE_DIR/before/nft-tables" && continue
      if nft -j list table "$family" "$table" 2>/dev/null | python3 -c 'import json, sys
items = json.load(sys.stdin)["nftables"]
sys.exit(0 if not any("rule" in i or ("chain" in i and "hook" not in i["chain"]) or "set" in i or "map" in i for i in items) else 1)'; then
        nft delete table "$family" "$table" 2>/dev/null || true
      fi
    done
  fi
  # 8. Sysctls back to their values from before.
  if [ -f "$NODE_DIR/before/network" ]; then
    while read -r key value; do
      [ "$(sysctl -n "$key" 2>/dev/null)" = "$value" ] || sysctl -qw "$key=$value" || log "could not reset $key"
    done <"$NODE_DIR/before/sysctls"
  fi
  # 9. What the parts left in the machine's directories.
  # The CNI cache of our sandboxes (ours: their network namespace is ours),
  # left there when the kubelet could not stop them (no API server).
  for f in /var/lib/cni/results/*; do
    [ -f "$f" ] && grep -qF "\"netns\":\"$NODE_DIR/" "$f" && rm -f "$f"
  done
  if [ -f "$NODE_DIR/before/dirs" ] && ! grep -qxF /var/lib/kubelet/device-plugins "$NODE_DIR/before/dirs"; then
    rm -f /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
  fi
  for f in /var/log/containers/*; do
    [ -L "$f" ] && case "$(readlink "$f")" in "$NODE_DIR"/*) rm -f "$f" ;; esac
  done
  if [ -f "$NODE_DIR/before/dirs" ]; then
    for dir in $NODE_HOST_DIRS; do
      grep -qxF "$dir" "$NODE_DIR/before/dirs" || rmdir "$dir" 2>/dev/null || true
    done
  fi
  if api_ready; then kubectl_ delete node "$NODE_NAME" --ignore-not-found >/dev/null 2>&1 || true; fi
  # Never remove files through a mount that is still there (a volume's bind
  # mount may show a directory of the machine).
  if [ -n "$(mounts_under "$NODE_DIR")$(mounts_under "$sockdir")" ]; then
    die "mounts are left under $NODE_DIR or $sockdir; unmount them, then run: hack/cluster node down"
  fi
  rm -rf "$NODE_DIR" "$sockdir"
  rm -f "$STATE/pki/node-client."* "$STATE/pki/node-serving."* "$STATE/pki/kube-proxy."*
  log "node stopped"
}

cmd_node() {
  case "${1:-}" in
  build) cmd_node_build ;;
  up) cmd_node_up ;;
  down) cmd_node_down ;;
  import)
    [ $# -eq 2 ] || { echo "usage: hack/cluster node import FILE" >&2; exit 2; }
    cmd_node_import "$2"
    ;;
  pid)
    [ $# -eq 2 ] || { echo "usage: hack/cluster node pid CONTAINER-ID" >&2; exit 2; }
    cmd_node_pid "$2"
    ;;
  *)
    echo "usage: hack/cluster node build|up|down|import FILE|pid CONTAINER-ID" >&2
    exit 2
    ;;
  esac
}
