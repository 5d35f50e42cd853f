#!/usr/bin/env bash
# What hack/cluster's parts share (sourced by hack/cluster, not run): the
# pinned Kubernetes version, the cache and state paths, logging, what a
# build needs, free ports, certificates and kubeconfigs, and the start, stop
# and watch of a component by the PID recorded in the state directory.

# The supported range's ends: the newest release (built and run by default,
# the main suite's) and the floor, the oldest supported (hack/test runs a
# subset of the suite on it). README.md, chart/Chart.yaml's kubeVersion,
# Cargo.toml's kubernetes-floor feature and src/core/versions.rs say the
# same (tests/suite/supported_range.rs checks it).
K8S_NEWEST=1.37.2
# shellcheck disable=SC2034 # read by hack/test and tests/suite/supported_range.rs
K8S_FLOOR=1.33.13
# The Kubernetes release to build and run: COPYRATOR_K8S_VERSION picks
# another than the newest (each is built once and cached apart).
K8S_VERSION=${COPYRATOR_K8S_VERSION:-$K8S_NEWEST}
# The API server's Service range; 10.0.0.1 is the `kubernetes` Service.
# shellcheck disable=SC2034 # used by control-plane.sh and node.sh
SERVICE_RANGE=10.0.0.0/24
# shellcheck disable=SC2034 # used by control-plane.sh and node.sh
SERVICE_IP=10.0.0.1

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/copyrator"
STATE="${COPYRATOR_CLUSTER_STATE:-$CACHE_ROOT/cluster}"
# The binaries of one release, cached apart.
use_version() { # version
  K8S_VERSION=$1
  CACHE="$CACHE_ROOT/k8s-$K8S_VERSION"
  BIN="$CACHE/bin"
}
use_version "$K8S_VERSION"
# The release a control plane in $STATE was started with, as `up` records
# it: every command but `build` and `up` acts on its binaries, whatever
# COPYRATOR_K8S_VERSION says now (a component is known by its binary's path).
started_version() { [ -f "$STATE/k8s-version" ] && cat "$STATE/k8s-version"; }

log() { printf 'cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_debian_package() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  log "installing Debian package $2"
  [ "$(id -u)" = 0 ] || die "$1 is missing; install the Debian package $2"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"; } >&2 \
    || die "could not install $2"
}

go_env() {
  # Go 1.27 switched encoding/json to its v2 implementation, which breaks the
  # API server's OpenAPI output; older releases need nothing.
  local minor
  minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
  if [ "${minor:-0}" -ge 27 ]; then export GOEXPERIMENT=nojsonv2; fi
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
}

# Distinct free loopback ports, all held while they are chosen (choosing
# one at a time can hand out the same port twice). They come from below the
# kernel's ephemeral range: a port from inside it can be taken, before our
# component binds it, as the local end of any outgoing connection (another
# control plane started beside this one makes thousands).
free_ports() {
  python3 -c 'import random,socket,sys
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
span = range(10000, low) if low > 12000 else range(low, 65536)
held, ports = [], []
while len(held) < int(sys.argv[1]):
    s = socket.socket()
    port = random.choice(span)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    held.append(s)
    ports.append(port)
print(" ".join(map(str, ports)))' "$1"
}

# Whether the process of the PID runs the component's binary: not a zombie
# (a zombie has no command line), not a PID reused by another program.
runs() { # pid name
  local argv0
  argv0=$({ tr '\0' '\n' <"/proc/$1/cmdline"; } 2>/dev/null | head -n1) || return 1
  [ "$argv0" = "$BIN/$2" ]
}

alive() { [ -f "$STATE/$1.pid" ] && runs "$(cat "$STATE/$1.pid")" "$1"; }

# Whether the control plane in $STATE is a member one (no kube-scheduler,
# no node): `up` records it there, so that every later command (stop,
# start, env, down) follows the state, not the environment.
is_member() { [ -f "$STATE/member" ]; }

api_ready() {
  [ -f "$STATE/admin.kubeconfig" ] &&
    "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1
}

etcd_url() { echo "http://127.0.0.1:$(cat "$STATE/etcd.port")"; }

# A key and a certificate signed by the cluster's CA, in $STATE/pki.
cert() { # name subject [extensions]
  (
    cd "$STATE/pki" || exit
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    printf '%s\n' "${3:-extendedKeyUsage=clientAuth}" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
      -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
  )
}

write_kubeconfig() { # file user
  local pki="$STATE/pki"
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: copyrator-test
  cluster:
    server: https://127.0.0.1:$(cat "$STATE/api.port")
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: copyrator-test
  context: {cluster: copyrator-test, user: $2, namespace: default}
current-context: copyrator-test
EOF
}

start() { # name command...
  local name=$1
  shift
  # Appended: a component started again keeps the log of its last run.
  setsid "$@" </dev/null >>"$STATE/$name.log" 2>&1 &
  local pid=$! deadline=$((SECONDS + 5))
  echo "$pid" >"$STATE/$name.pid"
  # Until the exec, the PID still runs this shell or setsid, and `alive`
  # would call the component dead before it has started: wait for the exec
  # (or for the process to be gone).
  while ! runs "$pid" "$name" && [ -e "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] &&
    [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.02
  done
}

wait_for() { # seconds command...
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

stop() { # name seconds
  alive "$1" || return 0
  local pid
  pid=$(cat "$STATE/$1.pid")
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + $2))
  while runs "$pid" "$1" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if runs "$pid" "$1"; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$STATE/$1.pid"
}
