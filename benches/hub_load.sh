#!/usr/bin/env bash
# Hub benchmarks (see BENCHMARKS.md, "Hub"):
#  1. conditional GETs answered 304, with per-cluster tokens over many clusters, against
#     the hub and against nginx serving `flotilla publish` output, same wrk settings;
#  2. the hub's memory with that fleet loaded;
#  3. commit-to-new-digest-served latency on a 1,000-cluster fleet in a local repository.
#
# Usage: benches/hub_load.sh            (from the repository root)
# Knobs (environment): CLUSTERS=10000 WORKLOADS=4 RESOURCES=5 DURATION=10s RUNS=3
#   CONNECTIONS=64 THREADS=1 LATENCY_CLUSTERS=1000 LATENCY_RUNS=5
#   GEN_FLEET="command --clusters N --workloads W --resources R OUT" to use another
#   fleet generator than `cargo run --release --example gen_fleet`.
#   FLOTILLA=PATH runs that flotilla binary (say, another commit's release build, to
#   compare side by side) instead of building this tree's; with GEN_FLEET too, nothing
#   is built. SKIP_NGINX=1 measures the hub alone (no nginx, no `flotilla publish`).
# Needs: cargo, git, python3, curl; installs wrk and nginx from Debian when missing.
# Everything listens on 127.0.0.1 only and stops by itself.
set -euo pipefail

CLUSTERS=${CLUSTERS:-10000}
WORKLOADS=${WORKLOADS:-4}
RESOURCES=${RESOURCES:-5}
DURATION=${DURATION:-10s}
RUNS=${RUNS:-3}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-1}
LATENCY_CLUSTERS=${LATENCY_CLUSTERS:-1000}
LATENCY_RUNS=${LATENCY_RUNS:-5}
HUB_PORT=${HUB_PORT:-18480}
NGINX_PORT=${NGINX_PORT:-18481}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SKIP_NGINX=${SKIP_NGINX:-0}

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || { [[ "$SKIP_NGINX" != 1 ]] && ! need nginx; }; then
  echo "installing wrk and nginx from Debian" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null
fi
for tool in git python3 curl; do need "$tool" || { echo "bench needs $tool" >&2; exit 2; }; done

cd "$ROOT"
if [[ -n "${FLOTILLA:-}" ]]; then
  FLOTILLA=$(realpath "$FLOTILLA")
else
  cargo build --release --quiet
  FLOTILLA="$ROOT/target/release/flotilla"
fi
if [[ -z "${GEN_FLEET:-}" ]]; then
  cargo build --release --quiet --example gen_fleet
  GEN_FLEET="$ROOT/target/release/examples/gen_fleet"
fi

WORK=$(mktemp -d /tmp/flotilla-hub-bench.XXXXXX)
chmod 755 "$WORK"   # nginx workers (user nobody) read the published files
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

git_quiet() { git -C "$1" -c user.name=bench -c user.email=bench@flotilla.invalid "${@:2}" >/dev/null; }

make_repo() { # make_repo DIR N
  $GEN_FLEET --clusters "$2" --workloads "$WORKLOADS" --resources "$RESOURCES" "$1" >/dev/null
  git_quiet "$1" init -q -b main
  git_quiet "$1" add -A
  git_quiet "$1" commit -q -m "generated fleet"
}

start_hub() { # start_hub REPO STATE LOG -> HUB_PID
  "$FLOTILLA" serve --repo "$1" --state-dir "$2" --listen "127.0.0.1:$HUB_PORT" \
    --poll-interval 1h --log-format json >"$3" 2>&1 &
  HUB_PID=$!
  PIDS+=("$HUB_PID")
}

wait_served() { # wait_served COUNT: until /readyz reports COUNT clusters
  for _ in $(seq 1 1200); do
    if curl -fs "http://127.0.0.1:$HUB_PORT/readyz" | grep -Eq "\"clusters\":$1[,}]"; then return 0; fi
    sleep 0.25
  done
  echo "the hub did not serve $1 clusters in time" >&2; exit 1
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# Tokens for every cluster, made the way `flotilla token create` stores them (only the
# SHA-256 in SQLite): making 10,000 through the command line one by one takes minutes.
make_tokens() { # make_tokens STATE_DIR OUT_TSV (cluster \t token)
  python3 - "$1/flotilla.db" "$2" <<'PY'
import hashlib, secrets, sqlite3, sys, time
db = sqlite3.connect(sys.argv[1])
names = [r[0] for r in db.execute("SELECT name FROM clusters ORDER BY name")]
now = int(time.time() * 1000)
with open(sys.argv[2], "w") as out:
    rows = []
    for name in names:
        token = "flt_" + secrets.token_hex(32)
        digest = hashlib.sha256(token.encode()).hexdigest()
        rows.append((digest[:12], digest, name, False, now, None))
        out.write(f"{name}\t{token}\n")
    db.executemany("INSERT INTO tokens (id, hash, cluster, admin, created_at, revoked_at) VALUES (?,?,?,?,?,?)", rows)
    gen = db.execute("SELECT value FROM hub_meta WHERE key='tokens_generation'").fetchone()
    db.execute("INSERT INTO hub_meta (key, value) VALUES ('tokens_generation', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
               (str(int(gen[0]) + 1 if gen else 1),))
db.commit()
PY
}

cpu_ticks() { # cpu_ticks PID...: user+system clock ticks used so far, all threads
  local total=0 pid fields
  for pid in "$@"; do
    read -r -a fields <"/proc/$pid/stat"
    total=$((total + fields[13] + fields[14]))
  done
  echo "$total"
}

# run_wrk URL REQUESTS_FILE PID... -> "requests/s  CPU-microseconds-per-request"
# The second figure (server CPU time over the run, divided by the requests answered)
# holds up better than the rate when other work shares the machine.
run_wrk() {
  local out before after requests
  before=$(cpu_ticks "${@:3}")
  out=$(REQUESTS="$2" wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$ROOT/benches/hub_load.lua" "$1")
  after=$(cpu_ticks "${@:3}")
  if grep -q "Non-2xx or 3xx" <<<"$out"; then echo "$out" >&2; echo "errors during the load run" >&2; exit 1; fi
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  awk -v rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")" -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" \
    'BEGIN {printf "%.0f %.2f\n", rps, t / hz * 1e6 / n}'
}

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {print int($2/1024)" MiB"}' /proc/meminfo), $(uname -r)"
echo "== fleet: $CLUSTERS clusters x $WORKLOADS workloads x $RESOURCES resources"
echo "== hub: $FLOTILLA"
REPO="$WORK/fleet"
make_repo "$REPO" "$CLUSTERS"

# The hub.
STATE="$WORK/state"
start_hub "$REPO" "$STATE" "$WORK/hub.log"
wait_served "$CLUSTERS"
make_tokens "$STATE" "$WORK/tokens.tsv"
sleep 2   # the hub re-reads tokens every second
python3 - "$STATE/flotilla.db" "$WORK/tokens.tsv" "$WORK/hub-requests.tsv" <<'PY'
import sqlite3, sys
digests = dict(sqlite3.connect(sys.argv[1]).execute("SELECT name, digest FROM clusters"))
with open(sys.argv[2]) as tokens, open(sys.argv[3], "w") as out:
    for line in tokens:
        name, token = line.rstrip("\n").split("\t")
        out.write(f"/v1/clusters/{name}/bundle\t{token}\t\"{digests[name]}\"\n")
PY
# Check one request by hand: a 304 with no body.
IFS=$'\t' read -r path token etag < "$WORK/hub-requests.tsv"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" -H "If-None-Match: $etag" "http://127.0.0.1:$HUB_PORT$path")
[[ "$code" == 304 ]] || { echo "expected 304 from the hub, got $code" >&2; exit 1; }

# nginx serving the published files, with its own ETags (mtime-size).
NGINX_PIDS=""
if [[ "$SKIP_NGINX" != 1 ]]; then
PUBLISHED="$WORK/published"
"$FLOTILLA" publish --repo "$REPO" --out "$PUBLISHED" >/dev/null
mkdir -p "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  sendfile on;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  default_type application/json;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    root $PUBLISHED;
  }
}
CONF
nginx -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" &
PIDS+=("$!")
python3 - "$WORK/tokens.tsv" "$PUBLISHED" "$WORK/nginx-requests.tsv" <<'PY'
import os, sys
published = sys.argv[2]
with open(sys.argv[1]) as tokens, open(sys.argv[3], "w") as out:
    for line in tokens:
        name, token = line.rstrip("\n").split("\t")
        st = os.stat(os.path.join(published, "v1/clusters", name, "bundle"))
        out.write(f"/v1/clusters/{name}/bundle\t{token}\t\"{int(st.st_mtime):x}-{st.st_size:x}\"\n")
PY
for _ in $(seq 1 40); do curl -fs -o /dev/null "http://127.0.0.1:$NGINX_PORT/v1/clusters/" 2>/dev/null && break; sleep 0.1; done
IFS=$'\t' read -r path token etag < "$WORK/nginx-requests.tsv"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "If-None-Match: $etag" "http://127.0.0.1:$NGINX_PORT$path")
[[ "$code" == 304 ]] || { echo "expected 304 from nginx, got $code" >&2; exit 1; }
NGINX_PIDS=$(pgrep -f "nginx -c $WORK/nginx/nginx.conf" | tr '\n' ' ')
NGINX_PIDS="$NGINX_PIDS $(for p in $NGINX_PIDS; do pgrep -P "$p"; done | tr '\n' ' ')"
fi

echo "== conditional GETs (304), wrk -t$THREADS -c$CONNECTIONS -d$DURATION, $CLUSTERS clusters, $RUNS runs each, alternating"
: >"$WORK/hub.rps"; : >"$WORK/nginx.rps"
for run in $(seq 1 "$RUNS"); do
  read -r hub hub_cpu < <(run_wrk "http://127.0.0.1:$HUB_PORT" "$WORK/hub-requests.tsv" "$HUB_PID")
  echo "$hub $hub_cpu" >>"$WORK/hub.rps"
  if [[ "$SKIP_NGINX" == 1 ]]; then echo "run $run: hub $hub req/s ($hub_cpu us CPU/request)"; continue; fi
  read -r ngx ngx_cpu < <(run_wrk "http://127.0.0.1:$NGINX_PORT" "$WORK/nginx-requests.tsv" $NGINX_PIDS)
  echo "$ngx $ngx_cpu" >>"$WORK/nginx.rps"
  echo "run $run: hub $hub req/s ($hub_cpu us CPU/request), nginx $ngx req/s ($ngx_cpu us CPU/request)"
done
HUB_MEDIAN=$(cut -d' ' -f1 "$WORK/hub.rps" | median); HUB_CPU=$(cut -d' ' -f2 "$WORK/hub.rps" | median)
if [[ "$SKIP_NGINX" == 1 ]]; then
  echo "median: hub $HUB_MEDIAN req/s"
  echo "median server CPU per 304: hub $HUB_CPU us"
else
  NGINX_MEDIAN=$(cut -d' ' -f1 "$WORK/nginx.rps" | median); NGINX_CPU=$(cut -d' ' -f2 "$WORK/nginx.rps" | median)
  echo "median: hub $HUB_MEDIAN req/s, nginx $NGINX_MEDIAN req/s, ratio $(awk -v h="$HUB_MEDIAN" -v n="$NGINX_MEDIAN" 'BEGIN {printf "%.2f", h/n}')"
  echo "median server CPU per 304: hub $HUB_CPU us, nginx $NGINX_CPU us"
fi
# The same without Lua: one cluster's URL, token and ETag as fixed headers. wrk spends
# less of its own time per request this way, so both servers are pushed harder.
plain_wrk() { # plain_wrk REQUESTS_FILE PORT PID... -> "requests/s CPU-microseconds-per-request"
  local path token etag out before after
  IFS=$'\t' read -r path token etag <"$1"
  before=$(cpu_ticks "${@:3}")
  out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -H "Authorization: Bearer $token" \
    -H "If-None-Match: $etag" -H "Accept-Encoding: gzip, zstd" "http://127.0.0.1:$2$path")
  after=$(cpu_ticks "${@:3}")
  if grep -q "Non-2xx or 3xx" <<<"$out"; then echo "$out" >&2; exit 1; fi
  awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" \
    '/requests in/ {n=$1} /Requests\/sec/ {rps=$2} END {printf "%.0f %.2f\n", rps, t / hz * 1e6 / n}' <<<"$out"
}
: >"$WORK/hub.plain"; : >"$WORK/nginx.plain"
for run in $(seq 1 "$RUNS"); do
  read -r hub hub_cpu < <(plain_wrk "$WORK/hub-requests.tsv" "$HUB_PORT" "$HUB_PID")
  echo "$hub $hub_cpu" >>"$WORK/hub.plain"
  if [[ "$SKIP_NGINX" == 1 ]]; then echo "one URL, no Lua, run $run: hub $hub req/s ($hub_cpu us CPU/request)"; continue; fi
  read -r ngx ngx_cpu < <(plain_wrk "$WORK/nginx-requests.tsv" "$NGINX_PORT" $NGINX_PIDS)
  echo "$ngx $ngx_cpu" >>"$WORK/nginx.plain"
  echo "one URL, no Lua, run $run: hub $hub req/s ($hub_cpu us CPU/request), nginx $ngx req/s ($ngx_cpu us CPU/request)"
done
if [[ "$SKIP_NGINX" == 1 ]]; then
  echo "median, one URL: hub $(cut -d' ' -f1 "$WORK/hub.plain" | median) req/s ($(cut -d' ' -f2 "$WORK/hub.plain" | median) us CPU)"
else
  echo "median, one URL: hub $(cut -d' ' -f1 "$WORK/hub.plain" | median) req/s ($(cut -d' ' -f2 "$WORK/hub.plain" | median) us CPU), nginx $(cut -d' ' -f1 "$WORK/nginx.plain" | median) req/s ($(cut -d' ' -f2 "$WORK/nginx.plain" | median) us CPU)"
fi
echo "== hub memory with $CLUSTERS clusters: RSS $(awk '/VmRSS/ {print int($2/1024)" MiB"}' "/proc/$HUB_PID/status"), peak $(awk '/VmHWM/ {print int($2/1024)" MiB"}' "/proc/$HUB_PID/status")"
grep -o '"render_ms":[0-9]*,"install_ms":[0-9]*' "$WORK/hub.log" | head -1 | sed 's/^/   first render and install: /'
kill "$HUB_PID"; wait "$HUB_PID" 2>/dev/null || true

# Restart: time until the stored bundles are served again, before any render.
start_hub "$REPO" "$STATE" "$WORK/hub-restart.log"
start=$(date +%s.%N)
for _ in $(seq 1 2000); do curl -fs -o /dev/null "http://127.0.0.1:$HUB_PORT/readyz" && break; sleep 0.005; done
echo "== restart with $CLUSTERS clusters: ready (serving from the store) after $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.0f ms", (e-s)*1000}')"
kill "$HUB_PID"; wait "$HUB_PID" 2>/dev/null || true

echo "== commit to new digest served, $LATENCY_CLUSTERS clusters, local repository (notify), $LATENCY_RUNS runs"
REPO2="$WORK/fleet-small"
make_repo "$REPO2" "$LATENCY_CLUSTERS"
STATE2="$WORK/state-small"
start_hub "$REPO2" "$STATE2" "$WORK/hub-small.log"
wait_served "$LATENCY_CLUSTERS"
TOKEN=$("$FLOTILLA" token create --admin --state-dir "$STATE2" | awk '{print $NF}')
sleep 1.5
CLUSTER=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT max(name) FROM clusters').fetchone()[0])" "$STATE2/flotilla.db")
URL="http://127.0.0.1:$HUB_PORT/v1/clusters/$CLUSTER/bundle"
: >"$WORK/latency"
for run in $(seq 1 "$LATENCY_RUNS"); do
  etag=$(curl -fs -o /dev/null -D - -H "Authorization: Bearer $TOKEN" "$URL" | awk 'tolower($1)=="etag:" {print $2}' | tr -d '\r')
  curl -fs -o /dev/null -w '%{http_code} %{time_total}\n' -H "Authorization: Bearer $TOKEN" -H "If-None-Match: $etag" \
    "$URL?wait=60s" >"$WORK/poll.out" &
  poll=$!
  sleep 0.3
  # Change every cluster's bundle: an overlay that annotates every resource.
  mkdir -p "$REPO2/overlays"
  cat >"$REPO2/overlays/bench-run.yaml" <<YAML
apiVersion: flotilla.dev/v1alpha1
kind: Overlay
metadata:
  name: bench-run
spec:
  clusterSelector: {}
  annotations:
    flotilla.dev/bench-run: "r$run"
YAML
  git_quiet "$REPO2" add -A
  git_quiet "$REPO2" commit -q -m "bench run $run"
  committed=$(date +%s.%N)
  wait "$poll"
  answered=$(date +%s.%N)
  read -r code _ <"$WORK/poll.out"
  [[ "$code" == 200 ]] || { echo "the long-poll answered $code" >&2; exit 1; }
  ms=$(awk -v s="$committed" -v e="$answered" 'BEGIN {printf "%.0f", (e-s)*1000}')
  echo "$ms" >>"$WORK/latency"
  echo "run $run: $ms ms ($(grep -o '"changed":[0-9]*' "$WORK/hub-small.log" | tail -1), $(grep -o '"render_ms":[0-9]*,"install_ms":[0-9]*' "$WORK/hub-small.log" | tail -1))"
done
echo "median commit-to-served latency: $(median <"$WORK/latency") ms"
