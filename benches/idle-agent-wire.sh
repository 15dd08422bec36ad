#!/usr/bin/env bash
# What an idle agent costs on the wire: bytes up and down an hour, and the size of
# an unchanged poll's answer, measured through a counting proxy on loopback.
#
#   benches/idle-agent-wire.sh                      # the agent's and hub's defaults, 10 minutes
#   RUN=1200 benches/idle-agent-wire.sh             # 20 minutes: five polls held 4 minutes
#   IDLE_TIMEOUT=60 benches/idle-agent-wire.sh      # behind a balancer that cuts connections idle 60 s
#   RUN=240 SCALE=10 benches/idle-agent-wire.sh     # time scaled down tenfold, 4 minutes
#   SHOW=1 benches/idle-agent-wire.sh               # also print one request and answer of each size
#   AGENT_ARGS="--wait 30s --heartbeat 2m" benches/idle-agent-wire.sh
#
# Starts the real hub (`flotilla serve --repo fleet-example`) on loopback, gives the
# cluster `blue` a token, puts benches/wire_proxy.py in front of the hub, and runs the
# edge agent (dir sink) through the proxy for RUN seconds (default 600). The first
# bundle and first report are the start-up cost; everything after the agent's first
# report has been received (the steady, idle state) is counted and scaled to an hour.
# With IDLE_TIMEOUT=S the proxy closes a connection on which nothing passed for S
# seconds, as a load balancer does.
#
# Where tcpdump can capture on loopback (root), the agent's packets to and from the
# proxy are captured too and their IP bytes (TCP/IP headers, TCP keepalive probes and
# acknowledgements included) are counted over the same window.
#
# SCALE=k (default 1) runs the agent k times faster than its defaults: every duration
# the agent waits on (`--wait`, `--heartbeat`, `--resync`; the hub's `--max-wait`;
# IDLE_TIMEOUT) is divided by k, so RUN seconds stand for k × RUN seconds of the
# defaults, and the bytes an hour are k × 3600 / window × the bytes counted. The
# agent's `--wait auto` cannot be scaled, so a scaled run gives it the fixed wait
# that `auto` asks for when nothing cuts its polls (WAIT, default 240 s, scaled); the
# only difference on the wire is the `wait=` value in the query (one or two
# characters a poll); the script reports it. Durations are whole seconds after
# scaling.
#
# Binaries: FLOTILLA_BIN (default target/release/flotilla) and AGENT_BIN (default
# target/release/flotilla-agent); debug builds send the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

run="${RUN:-600}"
scale="${SCALE:-1}"
bin="${FLOTILLA_BIN:-target/release/flotilla}"
agent_bin="${AGENT_BIN:-target/release/flotilla-agent}"
# The defaults of the binaries under test, in seconds (override to measure others).
# Keep WAIT in step with what the agent's `--wait auto` asks for (used only when
# SCALE is set) and MAX_WAIT with the hub's `--max-wait` default.
wait_s="${WAIT:-240}"
heartbeat_s="${HEARTBEAT:-}"
resync_s="${RESYNC:-600}"
max_wait_s="${MAX_WAIT:-}"
idle_timeout_s="${IDLE_TIMEOUT:-}"
cluster=blue

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
scaled() { python3 -c "import sys; print(max(1, round(float(sys.argv[1]) / float(sys.argv[2]))))" "$1" "$scale"; }

hub_port="$(free_port)"
hub_args=(serve --repo fleet-example --state-dir "$work/hub" --listen "127.0.0.1:$hub_port")
[ -n "$max_wait_s" ] && hub_args+=(--max-wait "$(scaled "$max_wait_s")s")
[ "$scale" != 1 ] && [ -z "$max_wait_s" ] && hub_args+=(--max-wait "$(scaled 240)s")
"$bin" "${hub_args[@]}" 2>"$work/hub.log" &
pids+=("$!")
for _ in $(seq 300); do
  curl -fs "http://127.0.0.1:$hub_port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
"$bin" token create "$cluster" --state-dir "$work/hub" | tail -n 1 | awk '{print $NF}' > "$work/token"
admin="$("$bin" token create --admin --state-dir "$work/hub" | tail -n 1 | awk '{print $NF}')"
sleep 2 # the hub picks up new tokens within a second

proxy_port="$(free_port)"
capture=""
if command -v tcpdump >/dev/null && [ "$(id -u)" = 0 ]; then
  tcpdump -i lo -U -s 128 -w "$work/wire.pcap" "tcp port $proxy_port" 2>"$work/tcpdump.log" &
  capture=$!
  pids+=("$capture")
  sleep 1
fi
proxy_args=("$proxy_port" "$hub_port" "$run" "$work/wire.json")
[ -n "$idle_timeout_s" ] && proxy_args+=("$(scaled "$idle_timeout_s")")
start_ns="$(date +%s%N)"
python3 benches/wire_proxy.py "${proxy_args[@]}" &
proxy=$!
pids+=("$proxy")
sleep 0.5

agent_args=(--cluster "$cluster" --state-dir "$work/agent" --sink "dir:$work/target"
  --server "http://127.0.0.1:$proxy_port" --token-file "$work/token")
if [ "$scale" != 1 ]; then
  agent_args+=(--wait "$(scaled "$wait_s")s" --resync "$(scaled "$resync_s")s")
  [ -n "$heartbeat_s" ] && agent_args+=(--heartbeat "$(scaled "$heartbeat_s")s")
fi
# shellcheck disable=SC2206
agent_args+=(${AGENT_ARGS:-})
"$agent_bin" "${agent_args[@]}" 2>"$work/agent.log" &
agent=$!
pids+=("$agent")
for _ in $(seq 600); do
  [ -f "$work/agent/status.json" ] && grep -q '"sent": true' "$work/agent/status.json" && break
  sleep 0.1
done
steady_from="$(python3 -c "import sys; print((int(sys.argv[1]) - int(sys.argv[2])) / 1e9 + 0.5)" "$(date +%s%N)" "$start_ns")"
# The hub's view at the end, to show the idle agent is still counted as in sync.
wait "$proxy" || true
state="$(curl -fs -H "Authorization: Bearer $admin" "http://127.0.0.1:$hub_port/v1/fleet" |
  python3 -c 'import json,sys; d=json.load(sys.stdin); print([c["state"] for c in d["clusters"] if c.get("name", c.get("cluster"))=="blue"][0])' || echo unknown)"
kill "$agent" 2>/dev/null || true
if [ -n "$capture" ]; then
  sleep 1
  kill -INT "$capture" 2>/dev/null || true
  wait "$capture" 2>/dev/null || true
fi

python3 - "$work/wire.json" "$steady_from" "$scale" "$state" "${agent_args[*]}" "$wait_s" "$start_ns" "$work/wire.pcap" ${SHOW:+show} <<'PY'
import collections, json, os, struct, sys
wire = json.load(open(sys.argv[1]))
steady_from, scale, state, args = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
start_s, pcap = int(sys.argv[7]) / 1e9, sys.argv[8]
end = wire["seconds"]
chunks = wire["chunks"]
start_up = sum(n for t, d, n, *_ in chunks if t < steady_from)
up = sum(n for t, d, n, *_ in chunks if t >= steady_from and d == "up")
down = [n for t, d, n, *_ in chunks if t >= steady_from and d == "down"]
window = end - steady_from
per_hour = lambda b: b * 3600 / (window * scale)
print(f"agent: {args}")
print(f"run {end:.0f} s (stands for {end * scale:.0f} s), steady window {window:.0f} s, connections {wire['connections']}")
print(f"start-up (first bundle and report): {start_up} bytes")
ups = [n for t, d, n, *_ in chunks if t >= steady_from and d == "up"]
print(f"steady: {up} bytes up in {len(ups)} requests; request sizes {sorted(set(ups))}")
print(f"steady: {up} bytes up, {sum(down)} down in {len(down)} answers; answer sizes {sorted(set(down))}")
print(f"per hour: {per_hour(up) / 1000:.1f} KB up + {per_hour(sum(down)) / 1000:.1f} KB down = {per_hour(up + sum(down)) / 1000:.1f} KB")
# A poll is the most common request and the most common answer; anything else in
# the window (a report) is listed apart, since a report made once after start-up
# (the first resync) would otherwise be scaled up as if it recurred.
poll_up = collections.Counter(ups).most_common(1)[0][0] if ups else 0
poll_down = collections.Counter(down).most_common(1)[0][0] if down else 0
polls = ups.count(poll_up)
others = [n for n in ups if n != poll_up]
wait_default = float(sys.argv[6])
print(f"a poll: {poll_up} bytes up + {poll_down} down = {poll_up + poll_down}; {polls} polls; other requests: {others}")
print(f"polls alone at one per {wait_default:.0f} s: {(poll_up + poll_down) * 3600 / wait_default / 1000:.1f} KB an hour")
if wire.get("cut"):
    print(f"connections the proxy cut as idle: {len(wire['cut'])}, at {wire['cut']} s")
if os.path.exists(pcap):
    # Classic pcap, loopback captured as Ethernet: 14 bytes of link header a packet.
    data = open(pcap, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    nano = magic == 0xA1B23C4D
    offset, packets, ip_bytes = 24, 0, 0
    while offset + 16 <= len(data):
        sec, frac, incl, orig = struct.unpack("<IIII", data[offset:offset + 16])
        offset += 16 + incl
        t = sec + frac / (1e9 if nano else 1e6) - start_s
        if steady_from <= t <= end:
            packets += 1
            ip_bytes += orig - 14
    print(f"IP bytes in the steady window (TCP/IP headers and keepalives included): {ip_bytes} in {packets} packets, "
          f"{per_hour(ip_bytes) / 1000:.1f} KB an hour")
if len(sys.argv) > 9:
    for key, text in wire["samples"].items():
        print(f"--- {key} bytes:\n{text}")
print(f"hub's state for the cluster at the end: {state}")
PY
