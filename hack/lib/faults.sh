#!/usr/bin/env bash
# The fault controls (sourced by hack/cluster): `stop` and `start` a
# component, `compact` etcd.

# --- faults ----------------------------------------------------------------

component() { # name: one that `up` starts, with a recorded PID file
  case "$1" in
  etcd | kube-apiserver | kube-controller-manager | kube-scheduler) ;;
  *) die "unknown component '$1'; one of: etcd, kube-apiserver, kube-controller-manager, kube-scheduler" ;;
  esac
  [ -f "$STATE/api.port" ] || die "no control plane in $STATE; run: hack/cluster up"
  [ -f "$STATE/etcd.port" ] || die "the control plane in $STATE predates fault controls; run: hack/cluster down; hack/cluster up"
  if [ "$1" = kube-scheduler ] && is_member; then
    die "the member control plane in $STATE has no kube-scheduler"
  fi
  [ "$1" != kube-scheduler ] || [ -f "$STATE/sched.port" ] ||
    die "the control plane in $STATE has no scheduler; run: hack/cluster down; hack/cluster up"
}

# SIGKILL, no chance to clean up; returns once the process is gone.
cmd_stop() { # name
  component "$1"
  if ! alive "$1"; then
    log "$1 is not running"
    rm -f "$STATE/$1.pid"
    return 0
  fi
  local pid deadline=$((SECONDS + 10))
  pid=$(cat "$STATE/$1.pid")
  kill -KILL "$pid"
  while runs "$pid" "$1"; do
    [ "$SECONDS" -lt "$deadline" ] || die "$1 (pid $pid) is still there 10 s after SIGKILL"
    sleep 0.05
  done
  rm -f "$STATE/$1.pid"
  log "$1 (pid $pid) killed"
}

# The same command line as `up` (same flags, ports, data and audit log).
cmd_start() { # name
  component "$1"
  if alive "$1"; then
    log "$1 is already running (pid $(cat "$STATE/$1.pid"))"
    return 0
  fi
  local fn=${1//-/_}
  "start_$fn"
  "wait_$fn" || {
    tail -n 5 "$STATE/$1.log" >&2 || true
    die "$1 did not become ready; see $STATE/$1.log"
  }
}

# Compacts etcd to its current revision, as the API server's own compactor
# does (every 5 minutes by default): the revision goes into etcd's
# compact_rev_key, whose watchers (every API server) learn of it, then etcd
# compacts. A watch or list from an older revision that etcd serves is then
# 410 Gone, and the API server's cache compacts its list snapshots too (it
# polls every 15 s). Prints the revision.
cmd_compact() {
  component etcd
  alive etcd || die "etcd is not running"
  local url revision answer
  url=$(etcd_url)
  # The header of any range request carries the current revision; key "\0".
  answer=$(curl -fsS -X POST "$url/v3/kv/range" -d '{"key": "AA==", "limit": 1}') ||
    die "cannot read etcd's revision from $url"
  revision=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["header"]["revision"])' <<<"$answer") ||
    die "no revision in etcd's answer: $answer"
  answer=$(python3 -c 'import base64, json, sys
b64 = lambda s: base64.b64encode(s.encode()).decode()
print(json.dumps({"key": b64("compact_rev_key"), "value": b64(sys.argv[1])}))' "$revision")
  curl -fsS -X POST "$url/v3/kv/put" -d "$answer" -o /dev/null ||
    die "cannot record the compaction in etcd's compact_rev_key"
  answer=$(curl -sS -X POST "$url/v3/kv/compaction" -d "{\"revision\": \"$revision\", \"physical\": true}") ||
    die "cannot compact etcd at $url"
  # Compacted already at this revision is as good.
  if ! python3 -c 'import json, sys
a = json.load(sys.stdin)
sys.exit(0 if "header" in a or "compacted" in str(a.get("error", "")) else 1)' <<<"$answer"; then
    die "etcd refused the compaction at revision $revision: $answer"
  fi
  log "etcd compacted at revision $revision"
  echo "$revision"
}
