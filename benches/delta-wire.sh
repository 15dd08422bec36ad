#!/usr/bin/env bash
# What one change costs on the wire when it reaches the agent as a delta, measured
# through the counting proxy (benches/wire_proxy.py) between the real agent and hub.
#
#   benches/delta-wire.sh                 # one changed field, then an image bump
#   RUNS=5 benches/delta-wire.sh          # five of each, median and range
#   SHOW=1 benches/delta-wire.sh          # also print what passed in each window
#
# A fleet of one cluster, `edge`, whose bundle is about 2.05 MB: 200 ConfigMaps of
# 10,000 characters of hexadecimal text each (which compress poorly, so a whole
# document costs about 1 MB even compressed) and 100 Deployments running
# `registry.example.com/app:1.0`. The hub (`flotilla serve`) follows the fleet's
# repository; the edge agent (dir sink) polls it through the proxy. Each run commits
# one change, waits until the agent reports the new digest applied, and counts the
# bytes the proxy passed from the commit to that report:
#
# - `field`: one ConfigMap's text changes (the first 8 characters of 10,000);
# - `image`: every Deployment moves to `registry.example.com/app:1.<run>`.
#
# `answer` is the woken long-poll's answer (status line, headers and the `dcz` body);
# `all` adds everything else that passed in the window: the agent's report of the new
# digest (which lists every resource's state) and its answer, and the next poll.
# Application bytes only (no TCP/IP framing).
#
# Binaries: FLOTILLA_BIN (default target/release/flotilla) and AGENT_BIN (default
# target/release/flotilla-agent); debug builds send the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${RUNS:-3}"
bin="$(realpath "${FLOTILLA_BIN:-target/release/flotilla}")"
agent_bin="$(realpath "${AGENT_BIN:-target/release/flotilla-agent}")"

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

repo="$work/fleet"
python3 - "$repo" <<'PY'
import os, sys
root = sys.argv[1]
def write(path, text):
    path = os.path.join(root, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
write("clusters/edge.yaml", "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge\nspec: {}\n")
write("workloads/bulk/workload.yaml", "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: bulk\nspec:\n  namespace: bulk\n  targets:\n    - cluster: edge\n")
for i in range(200):
    text = "".join("%08x" % (((i * 1250 + j) * 0x9E3779B97F4A7C15 % 2**64) >> 32) for j in range(1250))
    write(f"workloads/bulk/manifests/config-{i:03}.yaml",
          f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-{i:03}\ndata:\n  text: \"{text}\"\n")
for i in range(100):
    write(f"workloads/bulk/manifests/app-{i:03}.yaml",
          f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-{i:03}\nspec:\n"
          f"  selector: {{matchLabels: {{app: app-{i:03}}}}}\n"
          f"  template:\n    metadata: {{labels: {{app: app-{i:03}}}}}\n"
          f"    spec: {{containers: [{{name: app, image: 'registry.example.com/app:1.0'}}]}}\n")
PY
git -C "$repo" init -q --initial-branch=main
git -C "$repo" -c user.name=bench -c user.email=bench@localhost add -A
git -C "$repo" -c user.name=bench -c user.email=bench@localhost commit -qm fleet

hub_port="$(free_port)"
"$bin" token create edge --state-dir "$work/hub" --init 2>/dev/null | tail -n 1 | awk '{print $NF}' > "$work/token"
"$bin" serve --repo "$repo" --state-dir "$work/hub" --listen "127.0.0.1:$hub_port" --poll-interval 1s 2>"$work/hub.log" &
pids+=("$!")
for _ in $(seq 300); do
  curl -fs "http://127.0.0.1:$hub_port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

proxy_port="$(free_port)"
start_ns="$(date +%s%N)"
python3 benches/wire_proxy.py "$proxy_port" "$hub_port" 3600 "$work/wire.json" &
proxy=$!
pids+=("$proxy")
sleep 0.5
"$agent_bin" --cluster edge --state-dir "$work/agent" --sink "dir:$work/target" \
  --server "http://127.0.0.1:$proxy_port" --token-file "$work/token" 2>"$work/agent.log" &
pids+=("$!")

applied() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s.get("report",s).get("applied") or "", s.get("sent"))' "$work/agent/status.json" 2>/dev/null || true; }
wait_applied_other_than() {
  for _ in $(seq 1200); do
    local now
    now="$(applied)"
    if [ -n "${now%% *}" ] && [ "${now%% *}" != "$1" ] && [ "${now##* }" = True ]; then
      echo "${now%% *}"
      return
    fi
    sleep 0.05
  done
  echo "the agent did not apply a new digest; its log:" >&2
  tail -n 20 "$work/agent.log" >&2
  exit 1
}
first="$(wait_applied_other_than none)"
sleep 2 # the agent's next long-poll is held

commit() {
  git -C "$repo" -c user.name=bench -c user.email=bench@localhost commit -qam "$1"
}
elapsed() { python3 -c "import sys; print((int(sys.argv[1]) - int(sys.argv[2])) / 1e9)" "$(date +%s%N)" "$start_ns"; }
results="$work/results"
: > "$results"
current="$first"
for run in $(seq "$runs"); do
  for change in field image; do
    if [ "$change" = field ]; then
      python3 - "$repo/workloads/bulk/manifests/config-100.yaml" "$run" <<'PY'
import re, sys
path, run = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r'text: "(?:run\d+-)?[0-9a-f]{8}', f'text: "run{run}-', text, count=1)
open(path, "w").write(text)
PY
    else
      sed -i "s|registry.example.com/app:[0-9.]*|registry.example.com/app:1.$run|" "$repo"/workloads/bulk/manifests/app-*.yaml
    fi
    # The proxy's log is written when it stops; each change is timed from its commit.
    from="$(elapsed)"
    commit "$change $run"
    current="$(wait_applied_other_than "$current")"
    sleep 1
    to="$(elapsed)"
    echo "$change $from $to" >> "$results"
  done
done
kill -TERM "$proxy"
wait "$proxy" || true
grep -c "dcz" "$work/agent.log" >/dev/null 2>&1 || true

python3 - "$work/wire.json" "$results" "$(grep -c 'received as a delta' "$work/agent/status.json" 2>/dev/null || echo 0)" <<'PY'
import json, os, statistics, sys
wire = json.load(open(sys.argv[1]))
chunks = wire["chunks"]
rows = [line.split() for line in open(sys.argv[2])]
by = {}
for change, start, end in rows:
    start, end = float(start), float(end)
    window = [c for c in chunks if start <= c[0] <= end]
    # The woken poll's answer: the first answer after the commit (its status line
    # opens a chunk), and what follows it down until the agent speaks again.
    answer, started = 0, False
    for t, direction, size, head in window:
        if direction == "up" and started:
            break
        if direction == "down" and (started or head.startswith("HTTP/1.1 200")):
            started = True
            answer += size
    total = sum(c[2] for c in window)
    by.setdefault(change, []).append((answer, total))
    if os.environ.get("SHOW"):
        print(change, [(round(t - start, 3), d, n, h[:16]) for t, d, n, h in window])
def show(values):
    values = sorted(values)
    return f"median {statistics.median(values):,.0f} (range {values[0]:,}–{values[-1]:,})"
for change, label in (("field", "one changed field"), ("image", "an image bump in 100 Deployments")):
    rows = by.get(change, [])
    if not rows:
        continue
    print(f"{label}, {len(rows)} runs: answer {show([a for a, _ in rows])} bytes; "
          f"all in the window {show([t for _, t in rows])} bytes")
print(f"connections opened: {wire['connections']}")
PY
echo "the agent's log mentions deltas: $(grep -c -i 'delta' "$work/agent.log" || true) lines"
