#!/usr/bin/env bash
# The control plane (sourced by hack/cluster): `build` the pinned binaries,
# `up`, `env` and `down`, and each component's command line, which the
# fault controls (faults.sh) reuse.

HELM_VERSION=4.3.1
# etcd keeps its data in memory: the cluster is throw-away and fsync on a
# shared disk would make every write slow.
# One per state directory, so that two control planes never share it.
ETCD_DATA="/dev/shm/copyrator-etcd-$(id -u)-$(printf '%s' "$STATE" | md5sum | cut -c1-8)"

# The system's etcd binary (resolved), never our own link to it: $BIN may
# be on PATH already, and a link to itself would be a loop.
system_etcd() {
  local dir dirs real
  IFS=: read -ra dirs <<<"$PATH"
  for dir in "${dirs[@]}" /usr/bin; do
    [ "$dir" = "$BIN" ] && continue
    real=$(readlink -f "$dir/etcd" 2>/dev/null) || continue
    if [ -f "$real" ] && [ -x "$real" ]; then
      echo "$real"
      return 0
    fi
  done
  return 1
}

build_kubernetes() { # command...: the ones to build
  local src="$CACHE/src/kubernetes" proxy minor
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  mkdir -p "$src" "$BIN"
  proxy=$(go env GOPROXY | tr ',|' '\n' | grep -E '^https?://' | head -n1)
  [ -n "$proxy" ] || proxy=https://proxy.golang.org
  # k8s.io/kubernetes replaces its staging modules with local paths, so it
  # cannot be built as a dependency as it stands. A wrapper module replaces
  # each of them with its published v0.x.y tag instead.
  local upstream_mod
  upstream_mod=$(curl -fsS "$proxy/k8s.io/kubernetes/@v/v$K8S_VERSION.mod") \
    || die "cannot read k8s.io/kubernetes v$K8S_VERSION go.mod from $proxy"
  {
    echo "module copyrator.local/kubernetes-build"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    echo "$upstream_mod" | awk '/^replace \(/{r=1;next} r&&/^\)/{r=0} r&&/=> \.\/staging/{print $1}' |
      while read -r module; do
        # Only modules that kubernetes requires; some staging modules are never published.
        if echo "$upstream_mod" | grep -qE "^[[:space:]]+$module v0\.0\.0"; then
          echo "	$module => $module v0.$minor.${K8S_VERSION##*.}"
        fi
      done
    echo ")"
  } >"$src/go.mod"
  local now ldflags="-s -w"
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=$now"
  done
  local started=$SECONDS
  log "building $* v$K8S_VERSION (takes several minutes once)"
  (cd "$src" && go build -trimpath -ldflags "$ldflags" -o "$BIN/" "${@/#/k8s.io/kubernetes/cmd/}") >&2 ||
    die "building Kubernetes v$K8S_VERSION failed"
  log "built $* in $((SECONDS - started)) s"
}

build_helm() {
  log "building helm v$HELM_VERSION"
  GOBIN="$BIN" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION" >&2 || die "building helm v$HELM_VERSION failed"
}

cmd_build() {
  need_debian_package go golang-go
  need_debian_package openssl openssl
  need_debian_package curl curl
  system_etcd >/dev/null || need_debian_package etcd etcd-server
  go_env
  mkdir -p "$BIN"
  # The kubelet (for a node on this machine) is built with the rest: one
  # build step and one cache serve the whole cluster.
  local cmd missing=()
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    [ -x "$BIN/$cmd" ] || missing+=("$cmd")
  done
  [ ${#missing[@]} -eq 0 ] || build_kubernetes "${missing[@]}"
  [ -x "$BIN/helm" ] || build_helm
  local etcd
  etcd=$(system_etcd) || die "etcd is missing; install the Debian package etcd-server"
  ln -sfn "$etcd" "$BIN/etcd"
}

# Healthy, or dead (then stop waiting: the caller checks which).
etcd_healthy() {
  alive etcd || return 0
  curl -fsS "$(etcd_url)/health" -o /dev/null 2>/dev/null
}

default_service_account_exists() {
  "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" -n default get serviceaccount default >/dev/null 2>&1
}

print_env() {
  echo "export KUBECONFIG=$STATE/admin.kubeconfig"
  echo "export PATH=$BIN:\$PATH"
}

make_certs() {
  local d="$STATE/pki" member=$1
  mkdir -p "$d"
  (
    cd "$d" || exit
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 365 \
      -subj "/CN=copyrator-test-ca" 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    cert apiserver "/CN=kube-apiserver" \
      "subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth"
    cert admin "/O=system:masters/CN=kubernetes-admin"
    cert controller-manager "/CN=system:kube-controller-manager"
    [ "$member" = 1 ] || cert scheduler "/CN=system:kube-scheduler"
    # How the API server proves itself to a kubelet (logs, exec, port-forward).
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  )
}

# --- components ------------------------------------------------------------
# Each component's command line is defined once, from the ports and paths
# that `up` recorded in $STATE; `up` and `start` both use these.

start_etcd() {
  local peer_port
  peer_port=$(cat "$STATE/etcd-peer.port")
  start etcd "$BIN/etcd" --name copyrator-test --data-dir "$(cat "$STATE/etcd.data")" \
    --listen-client-urls "$(etcd_url)" \
    --advertise-client-urls "$(etcd_url)" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "copyrator-test=http://127.0.0.1:$peer_port" \
    --quota-backend-bytes $((4 * 1024 * 1024 * 1024))
}

wait_etcd() { wait_for 30 etcd_healthy && alive etcd && log "etcd ready"; }

start_kube_apiserver() {
  local pki="$STATE/pki" audit=() audit_log
  audit_log=$(cat "$STATE/audit.path")
  if [ -n "$audit_log" ]; then
    # Metadata-level audit of every request: the benchmark counts requests by user and verb.
    # Never rotated: the tests read the log from an offset. 0 does not say
    # so to every release (1.33 rotates at its default of 100 MB): 1 TB does.
    audit=(--audit-policy-file="$STATE/audit-policy.yaml" --audit-log-path="$audit_log"
      --audit-log-maxsize=1048576 --audit-log-mode=batch --audit-log-batch-max-wait=1s)
  fi
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="$(etcd_url)" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
    --secure-port="$(cat "$STATE/api.port")" \
    --endpoint-reconciler-type=none \
    --authorization-mode=Node,RBAC \
    --client-ca-file="$pki/ca.crt" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range="$SERVICE_RANGE" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --cert-dir="$STATE/apiserver-certs" \
    "${audit[@]}"
}

# Ready, or dead (then stop waiting: the caller checks which).
api_ready_or_dead() { ! alive kube-apiserver || api_ready; }

wait_kube_apiserver() {
  wait_for 60 api_ready_or_dead && alive kube-apiserver && log "kube-apiserver ready"
}

start_kube_controller_manager() {
  local pki="$STATE/pki"
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$(cat "$STATE/cm.port")" \
    --controllers='*,-nodeipam' --use-service-account-credentials --leader-elect=false \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key"
}

# Serving its health check, or dead (then stop waiting: the caller checks which).
controller_manager_healthy() {
  alive kube-controller-manager || return 0
  curl -fsSk "https://127.0.0.1:$(cat "$STATE/cm.port")/healthz" -o /dev/null 2>/dev/null
}

wait_kube_controller_manager() {
  wait_for 60 controller_manager_healthy && wait_for 60 default_service_account_exists &&
    alive kube-controller-manager && log "kube-controller-manager ready"
}

start_kube_scheduler() {
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$(cat "$STATE/sched.port")" \
    --leader-elect=false
}

# Serving its health check, or dead (then stop waiting: the caller checks which).
scheduler_healthy() {
  alive kube-scheduler || return 0
  curl -fsSk "https://127.0.0.1:$(cat "$STATE/sched.port")/healthz" -o /dev/null 2>/dev/null
}

wait_kube_scheduler() {
  wait_for 60 scheduler_healthy && alive kube-scheduler && log "kube-scheduler ready"
}

# A component that did not start: show why, stop it, and record another
# free port for its next attempt (its own may have been taken meanwhile).
retry_on_other_port() { # name port-file attempt
  log "$1 did not start (attempt $3); the end of its log:"
  tail -n 5 "$STATE/$1.log" >&2 || true
  stop "$1" 5
  [ "$3" -lt 3 ] || die "$1 did not start; see $STATE/$1.log"
  free_ports 1 >"$STATE/$2"
}

# COPYRATOR_MEMBER: 1 for a member control plane, else a home one.
requested_member() {
  case "${COPYRATOR_MEMBER:-}" in
  "" | 0) echo 0 ;;
  1) echo 1 ;;
  *) die "COPYRATOR_MEMBER is '$COPYRATOR_MEMBER'; set it to 1 (a member control plane) or leave it unset" ;;
  esac
}

# Every component of the kind of control plane asked for runs, and the
# API server answers; a control plane of the other kind is never reused.
control_plane_running() { # member: 1 or 0
  if [ "$1" = 1 ]; then is_member; else ! is_member; fi &&
    alive etcd && alive kube-apiserver && alive kube-controller-manager &&
    { [ "$1" = 1 ] || alive kube-scheduler; } && api_ready
}

cmd_up() {
  local member started=$SECONDS
  member=$(requested_member) || exit
  if [ "$member" = 1 ] && [ "${COPYRATOR_NODE:-}" = 1 ]; then
    die "a member control plane has no node: unset COPYRATOR_NODE or COPYRATOR_MEMBER"
  fi
  cmd_build
  local requested=$K8S_VERSION recorded
  if recorded=$(started_version) && [ "$recorded" != "$requested" ]; then
    # Another release runs there: stop it with its own binaries.
    use_version "$recorded"
    cmd_down >/dev/null 2>&1 || true
    use_version "$requested"
  fi
  if control_plane_running "$member"; then
    log "reusing the control plane in $STATE"
    if [ "${COPYRATOR_NODE:-}" = 1 ]; then cmd_node_up; fi
    print_env
    return 0
  fi
  cmd_down >/dev/null 2>&1 || true
  mkdir -p "$STATE"
  echo "$K8S_VERSION" >"$STATE/k8s-version"
  if [ "$member" = 1 ]; then : >"$STATE/member"; fi
  make_certs "$member"
  local etcd_port peer_port api_port cm_port sched_port attempt
  echo "$ETCD_DATA" >"$STATE/etcd.data"
  # A port chosen free can be taken before etcd binds it: try again with others.
  for attempt in 1 2 3; do
    read -r etcd_port peer_port api_port cm_port sched_port <<<"$(free_ports 5)"
    echo "$etcd_port" >"$STATE/etcd.port"
    echo "$peer_port" >"$STATE/etcd-peer.port"
    echo "$api_port" >"$STATE/api.port"
    echo "$cm_port" >"$STATE/cm.port"
    # A member has no scheduler: no port of its own either.
    if [ "$member" = 0 ]; then echo "$sched_port" >"$STATE/sched.port"; fi
    rm -rf "$ETCD_DATA"
    start_etcd
    if wait_etcd; then
      break
    fi
    log "etcd did not start (attempt $attempt); the end of its log:"
    tail -n 5 "$STATE/etcd.log" >&2 || true
    stop etcd 5
    [ "$attempt" -lt 3 ] || die "etcd did not start; see $STATE/etcd.log"
  done

  # The audit log is chosen once, here: `start kube-apiserver` reuses it.
  printf '%s\n' "${COPYRATOR_AUDIT_LOG:-}" >"$STATE/audit.path"
  if [ -n "${COPYRATOR_AUDIT_LOG:-}" ]; then
    printf 'apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: ["RequestReceived"]\nrules:\n- level: Metadata\n' \
      >"$STATE/audit-policy.yaml"
  fi
  for attempt in 1 2 3; do
    start_kube_apiserver
    write_kubeconfig "$STATE/admin.kubeconfig" admin
    write_kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager
    if [ "$member" = 0 ]; then write_kubeconfig "$STATE/scheduler.kubeconfig" scheduler; fi
    if wait_kube_apiserver; then break; fi
    retry_on_other_port kube-apiserver api.port "$attempt"
  done
  for attempt in 1 2 3; do
    start_kube_controller_manager
    if wait_kube_controller_manager; then break; fi
    retry_on_other_port kube-controller-manager cm.port "$attempt"
  done
  if [ "$member" = 0 ]; then
    for attempt in 1 2 3; do
      start_kube_scheduler
      if wait_kube_scheduler; then break; fi
      retry_on_other_port kube-scheduler sched.port "$attempt"
    done
  fi
  if [ "${COPYRATOR_NODE:-}" = 1 ]; then cmd_node_up; fi
  if [ "$member" = 1 ]; then
    log "member control plane up in $((SECONDS - started)) s (builds included)"
  else
    log "control plane up in $((SECONDS - started)) s (builds included)"
  fi
  print_env
}

cmd_down() {
  [ -d "$STATE" ] || { log "no control plane in $STATE"; return 0; }
  # The node first, while the API server can still drain it.
  cmd_node_down
  # The controller-manager and the scheduler hold watches that would keep
  # the API server's graceful shutdown waiting, so they go first; each wait
  # is bounded.
  stop kube-scheduler 5
  stop kube-controller-manager 5
  stop kube-apiserver 5
  stop etcd 5
  [ -f "$STATE/etcd.data" ] && rm -rf "$(cat "$STATE/etcd.data")"
  rm -rf "$STATE"
  log "stopped"
}

cmd_env() {
  { alive kube-apiserver && api_ready; } || die "no running control plane; run: hack/cluster up"
  print_env
}
