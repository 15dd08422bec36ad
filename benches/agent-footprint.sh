#!/usr/bin/env bash
# The edge agent's footprint: binary size, resident memory and CPU while idle.
#
#   cargo build --release --bin flotilla && cargo build --profile edge --bin flotilla-agent \
#     && benches/agent-footprint.sh [IDLE_SECONDS]
#   AGENT_BIN=target/release/flotilla benches/agent-footprint.sh   # `flotilla agent` instead
#   SYNTHETIC=2000 benches/agent-footprint.sh     # a bundle of 2,000 ConfigMaps instead
#   FAKE_BIN=target/release/examples/fake_api_server benches/agent-footprint.sh
#
# Renders one cluster of fleet-example (or makes a synthetic bundle of $SYNTHETIC
# ConfigMaps of about 1 KiB each), lays it out as `flotilla publish` would, and
# runs the edge agent (`flotilla-agent`) with the dir sink: against the folder (file://), against a
# static web server on loopback (http://, python3's http.server, which answers at
# once, so the agent paces itself to one request per --wait), and (fleet-example
# only) against the real hub, `flotilla serve`, which holds each long-poll; and
# (fleet-example only, with FAKE_BIN: `cargo build --release -p flotilla-kube-fake
# --example fake_api_server`) with the kube sink, applying to the fake API server
# over HTTPS through a kubeconfig, from the folder. After
# the first apply it samples VmRSS/VmHWM from /proc/PID/status and utime+stime from
# /proc/PID/stat over IDLE_SECONDS (default 30) of idle polling.
set -euo pipefail
cd "$(dirname "$0")/.."

idle="${1:-30}"
bin="${FLOTILLA_BIN:-target/release/flotilla}"
agent_bin="${AGENT_BIN:-target/edge/flotilla-agent}"
# `flotilla` runs its agent as a subcommand; the edge binary is the agent itself.
agent_cmd=("$agent_bin")
[ "$(basename "$agent_bin")" = "flotilla" ] && agent_cmd+=(agent)
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${SYNTHETIC:-}" ]; then
  mkdir -p "$work/render"
  document="$work/render/synthetic.json"
  # Canonical JSON of these simple objects is Python's sorted, compact form.
  python3 - "$SYNTHETIC" "$document" <<'PY'
import hashlib, json, sys
count, path = int(sys.argv[1]), sys.argv[2]
dump = lambda v: json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
items = [{"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": f"cm-{i:05d}", "namespace": "demo"},
          "data": {"value": "x" * 1000}} for i in range(count)]
resources = "[" + ",".join(dump(i) for i in items) + "]"
digest = "sha256:" + hashlib.sha256(resources.encode()).hexdigest()
open(path, "w").write('{"apiVersion":"flotilla.dev/v1alpha1","cluster":"synthetic","digest":"%s",'
                      '"kind":"Bundle","resources":%s,"revision":"main@sha1:0"}' % (digest, resources))
PY
else
  "$bin" render --repo fleet-example --out "$work/render" >/dev/null
  document="$(ls "$work/render"/*.json | head -n 1)"
fi
cluster="$(basename "$document" .json)"
mkdir -p "$work/pub/v1/clusters/$cluster"
cp "$document" "$work/pub/v1/clusters/$cluster/bundle"
resources="$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["resources"]))' "$document")"
echo "agent binary: $agent_bin, $(stat -c %s "$agent_bin") bytes"
echo "cluster $cluster: $resources resources"

ticks="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
kib() { awk -v key="$2:" '$1 == key {print $2}' "/proc/$1/status"; }

measure() {
  local label="$1"; shift
  local state="$work/state-$label" target="$work/target-$label"
  local sink="dir:$target"
  [ "$label" = kube ] && sink=kube
  "${agent_cmd[@]}" --cluster "$cluster" --state-dir "$state" --sink "$sink" \
    --wait 30s "$@" 2>"$work/$label.log" &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 600); do
    [ -f "$state/status.json" ] && grep -q '"applied": "sha256' "$state/status.json" && break
    sleep 0.1
  done
  grep -q '"applied": "sha256' "$state/status.json" || { cat "$work/$label.log"; exit 1; }
  sleep 2
  local before after
  before="$(cpu_ticks "$pid")"
  sleep "$idle"
  after="$(cpu_ticks "$pid")"
  printf '%-6s idle RSS %s KiB (anon %s, file %s; peak %s KiB), threads %s, CPU over %ss idle: %s ticks of 1/%ss\n' \
    "$label" "$(kib "$pid" VmRSS)" "$(kib "$pid" RssAnon)" "$(kib "$pid" RssFile)" \
    "$(kib "$pid" VmHWM)" "$(kib "$pid" Threads)" "$idle" "$((after - before))" "$ticks"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

measure file --server "file://$work/pub"

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work/pub" >/dev/null 2>&1 &
pids+=("$!")
sleep 1
# The static server checks no token; the agent still wants one of the right form.
printf "flt_%064d\n" 0 > "$work/token"
measure http --server "http://127.0.0.1:$port" --token-file "$work/token"

if [ -z "${SYNTHETIC:-}" ]; then
  hub_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$bin" serve --repo fleet-example --state-dir "$work/hub" --listen "127.0.0.1:$hub_port" \
    2>"$work/hub.log" &
  pids+=("$!")
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$hub_port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin" token create "$cluster" --state-dir "$work/hub" | tail -n 1 | awk '{print $NF}' \
    > "$work/hub-token"
  sleep 2  # the hub picks up new tokens within a second
  measure hub --server "http://127.0.0.1:$hub_port" --token-file "$work/hub-token"
fi

if [ -z "${SYNTHETIC:-}" ] && [ -n "${FAKE_BIN:-}" ]; then
  mkdir -p "$work/fake"
  "$FAKE_BIN" "$work/fake" >"$work/fake.log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 100); do
    grep -q '^ready' "$work/fake.log" && break
    sleep 0.1
  done
  grep -q '^ready' "$work/fake.log" || { cat "$work/fake.log"; exit 1; }
  KUBECONFIG="$work/fake/kubeconfig" measure kube --server "file://$work/pub"
fi
