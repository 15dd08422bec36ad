#!/usr/bin/env bash
# What hubs cost their database and object store at 10,000 clusters (BENCHMARKS.md,
# "Hubs on PostgreSQL and S3"): two hubs on one PostgreSQL database and one S3
# bucket, 10,000 simulated agents (examples/poll_load.rs) each holding a long-poll
# with its own token. Measured per hub, from the database's own statistics
# (pg_stat_statements, by database role: each hub connects as a role of its own) and
# the hub's /metrics:
#   - database statements and object-store requests per second, idle and during a
#     commit that changes every cluster's bundle;
#   - what an idle hub asks the database, statement by statement, so the background
#     (the change counter, token generation and rollouts version read every second,
#     lease renewals and heartbeats, the last-seen batch every 30 s) is counted and subtracted from the total;
#   - the hub's RSS with the long-polls held;
#   - how long after the render was recorded each agent had its new digest.
#
# Usage: benches/hub-cost.sh     (from anywhere; runs in a temporary folder)
# Knobs (environment): CLUSTERS=10000 AGENTS=$CLUSTERS WORKLOADS=2 RESOURCES=2
#   WAIT=55s IDLE=120 COMMIT_WINDOW=30 RUNS=3 RAMP=20 BUILD=debug|release
#   HTTP2=1 (the agents speak HTTP/2, each on a connection of its own)
#   DELTAS=1 (the agents report what they took and ask for deltas from it, as the real
#   agent does: the commit's new bundles then go as dcz deltas made ahead)
#   HUB_BINARY=PATH VARIANT=postgres|sqlite (sqlite: one hub alone, the default set-up: SQLite and the
#   objects in its state dir; no database statistics, no S3) KEEP=1 (keep the work folder)
#   PREBUILT=DIR (a cargo output folder, e.g. target/release, holding flotilla,
#   examples/poll_load and examples/gen_fleet already built: nothing is built)
# Needs: cargo, git, python3, curl, PostgreSQL 12+ binaries with pg_stat_statements
# (.ci/postgres installs the Debian package when missing), and moto for S3 (.ci/s3).
# Everything listens on 127.0.0.1 and stops at the end; the database and S3 servers
# are this script's own (in its work folder), not the ones the tests share.
set -euo pipefail

CLUSTERS=${CLUSTERS:-10000}
AGENTS=${AGENTS:-$CLUSTERS}
WORKLOADS=${WORKLOADS:-2}
RESOURCES=${RESOURCES:-2}
WAIT=${WAIT:-55s}
IDLE=${IDLE:-120}
COMMIT_WINDOW=${COMMIT_WINDOW:-30}
RUNS=${RUNS:-3}
RAMP=${RAMP:-20}
BUILD=${BUILD:-debug}
CLIENT_ARGS=()
[[ "${HTTP2:-0}" == 1 ]] && CLIENT_ARGS+=(--http2)
[[ "${DELTAS:-0}" == 1 ]] && CLIENT_ARGS+=(--deltas)
VARIANT=${VARIANT:-postgres}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_INCREMENTAL=0

for tool in git python3 curl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "hub-cost.sh needs $tool" >&2; exit 2; }
done
cd "$ROOT"
if [[ -n "${PREBUILT:-}" ]]; then
  BIN=$(cd "$PREBUILT" && pwd)
  for file in flotilla examples/poll_load examples/gen_fleet; do
    [[ -x "$BIN/$file" ]] || { echo "PREBUILT: no $BIN/$file" >&2; exit 2; }
  done
  BUILD="prebuilt ($BIN)"
elif ! command -v cargo >/dev/null 2>&1; then
  echo "hub-cost.sh needs cargo (or PREBUILT=DIR)" >&2; exit 2
elif [[ "$BUILD" == release ]]; then
  cargo build --release --quiet --bin flotilla --example poll_load --example gen_fleet
  BIN="$ROOT/target/release"
else
  cargo build --quiet --bin flotilla --example poll_load --example gen_fleet
  BIN="$ROOT/target/debug"
fi
# HUB_BINARY=PATH runs the hubs from another build of flotilla (say, an earlier
# commit's, to compare side by side); the client and generator are still this tree's.
FLOTILLA="${HUB_BINARY:-$BIN/flotilla}"

WORK=$(mktemp -d /tmp/flotilla-hub-cost.XXXXXX)
chmod 755 "$WORK"   # the PostgreSQL server runs as the postgres user
PIDS=()
PG_DIR="$WORK/pg"
S3_DIR="$WORK/s3"
PGBIN=""
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ -n "$PGBIN" && -f "$PG_DIR/data/postmaster.pid" ]]; then
    as_postgres "$PGBIN/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 || true
  fi
  if [[ -f "$S3_DIR/pid" ]]; then kill "$(cat "$S3_DIR/pid")" 2>/dev/null || true; fi
  if [[ "${KEEP:-0}" == 1 ]]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap "exit 130" INT TERM
as_postgres() { if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
git_quiet() { git -C "$1" -c user.name=bench -c user.email=bench@flotilla.invalid "${@:2}" >/dev/null; }

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {print int($2/1024)" MiB"}' /proc/meminfo), load average $(cut -d' ' -f1-3 /proc/loadavg), $BUILD build"
echo "== fleet: $CLUSTERS clusters x $WORKLOADS workloads x $RESOURCES resources; $AGENTS agents, wait $WAIT; variant $VARIANT; HTTP/$([[ "${HTTP2:-0}" == 1 ]] && echo 2 || echo 1.1); deltas ${DELTAS:-0}"
REPO="$WORK/fleet"
"$BIN/examples/gen_fleet" --clusters "$CLUSTERS" --workloads "$WORKLOADS" --resources "$RESOURCES" --git "$REPO" >/dev/null 2>&1

# S3: a moto server of this run's own (the virtual environment .ci/s3 made before is
# reused when there is one).
mkdir -p "$S3_DIR"
touch "$S3_DIR/server.log"
OBJECT_ARGS=()
if [[ "$VARIANT" == postgres ]]; then
  shared_venv="${TMPDIR:-/tmp}/flotilla-test-s3/venv"
  [[ -x "$shared_venv/bin/moto_server" ]] && ln -s "$shared_venv" "$S3_DIR/venv"
  S3=$(FLOTILLA_S3_DIR="$S3_DIR" "$ROOT/.ci/s3")
  curl -fs -X PUT "$S3/hub-cost" >/dev/null
  export AWS_ENDPOINT_URL="$S3" AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 \
    AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
  OBJECT_ARGS=(--objects "s3://hub-cost/fleet")
fi

HUB_NAMES=(a b)
if [[ "$VARIANT" == postgres ]]; then
  PG_URL=$(FLOTILLA_POSTGRES_DIR="$PG_DIR" "$ROOT/.ci/postgres")
  for candidate in /usr/lib/postgresql/*/bin; do PGBIN="$candidate"; done
  PG_PORT=${PG_URL##*:}; PG_PORT=${PG_PORT%%/*}
  psql() { as_postgres "$PGBIN/psql" -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"; }
  # Per-statement counts: pg_stat_statements needs loading at the server's start.
  psql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
  as_postgres "$PGBIN/pg_ctl" -D "$PG_DIR/data" -w restart >/dev/null 2>&1
  psql -c "CREATE EXTENSION pg_stat_statements" -c "CREATE ROLE hub_a LOGIN SUPERUSER" -c "CREATE ROLE hub_b LOGIN SUPERUSER"
  DATABASE_OF() { echo "postgres://hub_$1@127.0.0.1:$PG_PORT/postgres"; }
  CLIENT_DATABASE="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
else
  HUB_NAMES=(a)
  DATABASE_OF() { echo "sqlite://$WORK/hub-$1/flotilla.db"; }
  CLIENT_DATABASE="sqlite://$WORK/hub-a/flotilla.db"
fi

declare -A HUB_PID HUB_URL
for hub in "${HUB_NAMES[@]}"; do
  port=$(free_port)
  HUB_URL[$hub]="http://127.0.0.1:$port"
  mkdir -p "$WORK/hub-$hub"
  "$FLOTILLA" serve --repo "$REPO" --state-dir "$WORK/hub-$hub" --database "$(DATABASE_OF "$hub")" \
    "${OBJECT_ARGS[@]}" --listen "127.0.0.1:$port" --log-format json >"$WORK/hub-$hub.log" 2>&1 &
  HUB_PID[$hub]=$!
  PIDS+=("$!")
done
for hub in "${HUB_NAMES[@]}"; do
  for _ in $(seq 1 1200); do
    curl -fs "${HUB_URL[$hub]}/readyz" 2>/dev/null | grep -Eq "\"clusters\":$CLUSTERS[,}]" && break
    kill -0 "${HUB_PID[$hub]}" 2>/dev/null || { cat "$WORK/hub-$hub.log" >&2; exit 1; }
    sleep 0.5
  done
  curl -fs "${HUB_URL[$hub]}/readyz" | grep -Eq "\"clusters\":$CLUSTERS[,}]" || { echo "hub $hub did not serve $CLUSTERS clusters" >&2; exit 1; }
done
echo "== hubs ready: $(for h in "${HUB_NAMES[@]}"; do echo -n "$h ${HUB_URL[$h]} "; done)"

# sample NAME: the database's statistics per hub role, each hub's /metrics and RSS.
sample() {
  local out="$WORK/samples/$1"
  mkdir -p "$out"
  date +%s.%N >"$out/time"
  wc -l <"$S3_DIR/server.log" >"$out/s3-lines"
  if [[ "$VARIANT" == postgres ]]; then
    psql -A -F $'\t' -t -c "SELECT r.rolname, s.calls, s.rows, regexp_replace(s.query, '\s+', ' ', 'g')
      FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname LIKE 'hub_%'" >"$out/statements"
    psql -A -F $'\t' -t -c "SELECT xact_commit, tup_fetched, tup_returned FROM pg_stat_database WHERE datname = 'postgres'" >"$out/database"
  fi
  for hub in "${HUB_NAMES[@]}"; do
    curl -fs "${HUB_URL[$hub]}/metrics" >"$out/metrics-$hub"
    awk '/VmRSS|VmHWM/ {print $1, $2}' "/proc/${HUB_PID[$hub]}/status" >"$out/rss-$hub"
  done
}

# window FROM TO LABEL: per hub, statements and object-store requests per second.
window() {
  python3 - "$WORK/samples/$1" "$WORK/samples/$2" "$3" "$VARIANT" "$S3_DIR/server.log" "${HUB_NAMES[@]}" <<'PY'
import re, sys, os
a, b, label, variant, s3_log, hubs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
seconds = float(open(f"{b}/time").read()) - float(open(f"{a}/time").read())
def statements(path):
    out = {}
    for line in open(path):
        parts = line.rstrip("\n").split("\t", 3)
        if len(parts) == 4:
            role, calls, rows, query = parts
            key = (role, query)
            c, r = out.get(key, (0, 0))
            out[key] = (c + int(calls), r + int(rows))
    return out
def metric(path, name):
    for line in open(path):
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0
def metric_sum(path, prefix):
    return sum(float(l.split()[-1]) for l in open(path) if l.startswith(prefix))
def kind(q):
    ql = q.lower()
    if "hub_meta" in ql and ql.startswith("select"): return "change counter / token generation / rollouts version read (1 s each)"
    if "hub_leases" in ql: return "lease renewal (every 5 s)"
    if re.search(r"\b(into|update) hubs\b", ql): return "heartbeat (every 5 s)"
    if "cluster_seen" in ql and ql.startswith("insert"): return "last-seen batch (every 30 s, one row per cluster polled)"
    if ql in ("begin", "commit", "rollback"): return "BEGIN/COMMIT"
    return "other"
print(f"-- {label}: {seconds:.1f} s")
for hub in hubs:
    role = f"hub_{hub}"
    line = f"   hub {hub}:"
    if variant == "postgres":
        s0, s1 = statements(f"{a}/statements"), statements(f"{b}/statements")
        by_kind, rows_kind, top = {}, {}, []
        for (r, q), (c, rows) in s1.items():
            if r != role: continue
            c0, rows0 = s0.get((r, q), (0, 0))
            dc = c - c0
            if dc <= 0: continue
            k = kind(q)
            by_kind[k] = by_kind.get(k, 0) + dc
            rows_kind[k] = rows_kind.get(k, 0) + rows - rows0
            top.append((dc, q))
        total = sum(by_kind.values())
        background = sum(v for k, v in by_kind.items() if k != "other" and k != "BEGIN/COMMIT")
        line += f" {total / seconds:.2f} statements/s (" + ", ".join(
            f"{k}: {v} = {v / seconds:.2f}/s, {rows_kind[k]} rows" for k, v in sorted(by_kind.items())) + ")"
        line += f"; other than the background: {by_kind.get('other', 0)} statements"
        print(line)
        for dc, q in sorted(top, reverse=True)[:12]:
            print(f"      {dc:7d}  {q[:150]}")
    else:
        print(line)
    requests = metric(f"{b}/metrics-{hub}", "flotilla_object_store_requests_total") - metric(f"{a}/metrics-{hub}", "flotilla_object_store_requests_total")
    r200 = metric(f"{b}/metrics-{hub}", 'flotilla_bundle_responses_total{code="200"}') - metric(f"{a}/metrics-{hub}", 'flotilla_bundle_responses_total{code="200"}')
    r304 = metric(f"{b}/metrics-{hub}", 'flotilla_bundle_responses_total{code="304"}') - metric(f"{a}/metrics-{hub}", 'flotilla_bundle_responses_total{code="304"}')
    held = metric(f"{b}/metrics-{hub}", "flotilla_long_polls_held")
    rss = dict(l.split() for l in open(f"{b}/rss-{hub}"))
    print(f"      object-store requests: {requests:.0f} = {requests / seconds:.2f}/s; bundle answers: {r304:.0f} x 304, {r200:.0f} x 200;"
          f" long-polls held at the end: {held:.0f}; RSS {int(rss['VmRSS:']) // 1024} MiB (peak {int(rss['VmHWM:']) // 1024} MiB)")
n0, n1 = int(open(f"{a}/s3-lines").read()), int(open(f"{b}/s3-lines").read())
methods = {}
with open(s3_log, errors="replace") as log:
    for i, line in enumerate(log):
        if n0 <= i < n1:
            m = re.search(r'"(?:\x1b\[[0-9;]*m)?([A-Z]+) /', line)
            if m: methods[m.group(1)] = methods.get(m.group(1), 0) + 1
print("   the S3 server's own log (both hubs): " + (", ".join(f"{k} {v}" for k, v in sorted(methods.items())) or "no requests"))
if variant == "postgres":
    d0 = [int(x) for x in open(f"{a}/database").read().split()]
    d1 = [int(x) for x in open(f"{b}/database").read().split()]
    print(f"   pg_stat_database (whole server, both hubs and this script's sampling): {(d1[0]-d0[0]) / seconds:.2f} commits/s, {(d1[1]-d0[1]) / seconds:.0f} tuples fetched/s")
PY
}

commit_all() { # commit_all N: an overlay that annotates every resource of every cluster
  mkdir -p "$REPO/overlays"
  cat >"$REPO/overlays/bench-run.yaml" <<YAML
apiVersion: flotilla.dev/v1alpha1
kind: Overlay
metadata:
  name: bench-run
spec:
  clusterSelector: {}
  annotations:
    flotilla.dev/bench-run: "r$1"
YAML
  git_quiet "$REPO" add -A
  git_quiet "$REPO" commit -q -m "bench run $1"
}

HUB_ARGS=()
for hub in "${HUB_NAMES[@]}"; do HUB_ARGS+=(--hub "${HUB_URL[$hub]}"); done
for run in $(seq 1 "$RUNS"); do
  idle=0; [[ "$run" == 1 ]] && idle=$IDLE
  duration=$((RAMP + 20 + idle + COMMIT_WINDOW + 10))
  "$BIN/examples/poll_load" "${HUB_ARGS[@]}" --database "$CLIENT_DATABASE" --agents "$AGENTS" \
    --wait "$WAIT" --ramp "${RAMP}s" --duration "${duration}s" --every 5s --tokens "$WORK/tokens.tsv" "${CLIENT_ARGS[@]}" \
    >"$WORK/client-$run.out" 2>"$WORK/client-$run.err" &
  client=$!
  PIDS+=("$client")
  for _ in $(seq 1 600); do
    grep -q '^ready:' "$WORK/client-$run.out" && break
    kill -0 "$client" 2>/dev/null || { cat "$WORK/client-$run.out" "$WORK/client-$run.err" >&2; exit 1; }
    sleep 1
  done
  grep -q '^ready:' "$WORK/client-$run.out" || { echo "the agents did not all start" >&2; exit 1; }
  echo "== run $run: $(grep '^tokens:' "$WORK/client-$run.out"); every agent holds a long-poll"
  sleep 5
  if [[ "$idle" -gt 0 ]]; then
    sample "idle-start-$run"
    sleep "$idle"
    sample "idle-end-$run"
    window "idle-start-$run" "idle-end-$run" "idle, $AGENTS agents holding long-polls (run $run)"
  fi
  sample "commit-start-$run"
  commit_all "$run"
  committed_ms=$(date +%s%3N)
  echo "   committed at unix_ms $committed_ms"
  sleep "$COMMIT_WINDOW"
  sample "commit-end-$run"
  window "commit-start-$run" "commit-end-$run" "commit changing all $CLUSTERS clusters, the $COMMIT_WINDOW s after it (run $run)"
  wait "$client" || { cat "$WORK/client-$run.err" >&2; exit 1; }
  grep '^summary:' "$WORK/client-$run.out" | sed 's/^/   client /'
  errors=$(grep -c . "$WORK/client-$run.err" || true)
  if [[ "$errors" != 0 ]]; then
    echo "   client errors ($errors lines), first:"
    head -3 "$WORK/client-$run.err"
    # When they came, against the commit, and how long each failed request had waited.
    python3 - "$WORK/client-$run.err" "$committed_ms" <<'PY'
import re, sys, statistics
committed = int(sys.argv[2])
before, soon, later, waited = 0, 0, 0, []
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"at unix_ms (\d+)(?: after (\d+) ms)?", line)
    if not m: continue
    at = int(m.group(1))
    if m.group(2): waited.append(int(m.group(2)))
    if at < committed: before += 1
    elif at < committed + 10_000: soon += 1
    else: later += 1
print(f"   errors: {before} before the commit, {soon} in the 10 s after it, {later} later;"
      + (f" each failed request had waited {statistics.median(waited)} ms (median), {min(waited)}-{max(waited)} ms" if waited else ""))
PY
  fi
  for hub in "${HUB_NAMES[@]}"; do
    grep -o '"render_ms":[0-9]*,"install_ms":[0-9]*' "$WORK/hub-$hub.log" | tail -1 | sed "s/^/   hub $hub last render: /" || true
  done
done
