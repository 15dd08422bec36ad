#!/usr/bin/env bash
# How long a commit takes to be served: from `git commit` until the hub logs
# "serving the new render", for commits that each change one cluster file.
#
#   benches/commit-latency.sh REPO CLUSTER_FILE [RUNS] [-- extra `flotilla serve` arguments]
#   benches/commit-latency.sh /tmp/fleet clusters/edge-00042.yaml 5
#   benches/commit-latency.sh /tmp/fleet clusters/edge-00042.yaml 5 -- --render-in-process
#
# REPO is a Git repository holding a fleet (for instance `gen_fleet` output made a
# repository with a commit tagged `base`); CLUSTER_FILE, relative to REPO, is a
# cluster file with a `site:` variable under `spec.vars` (as `gen_fleet` writes
# them). The script checks out a branch `follow` at `base`, starts the real hub on
# loopback following that branch (SQLite, objects in a temporary state folder, the
# repository watched, so a commit is seen at once), waits for its first render,
# then makes RUNS commits, each appending a character to that `site:` value, and
# prints per commit the milliseconds from just before `git commit` until the hub
# logs the new render as served (which includes `git commit` itself), with the
# render and install times the hub logs and its RSS. REPO is left on `base`, with
# the branch `follow` holding the commits.
#
# Binary: FLOTILLA_BIN (default target/release/flotilla). GAP=SECONDS waits that
# long before each commit (default 0): commits minutes apart find the hub, and its
# render process, idle, their freed memory given back to the system.
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,20p' "$0"
  exit 2
fi
bin="$(realpath "${FLOTILLA_BIN:-target/release/flotilla}")"
repo="$(realpath "$1")"
file="$2"
runs="${3:-5}"
shift $(( $# >= 3 ? 3 : 2 ))
[ "${1:-}" = "--" ] && shift

state="$(mktemp -d)"
log="$state/log"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  git -C "$repo" checkout -q base
  rm -rf "$state"
}
trap cleanup EXIT

served() { grep -c "serving the new render" "$log" || true; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }

git -C "$repo" checkout -q -B follow base
"$bin" serve --repo "$repo" --branch follow --state-dir "$state/hub" \
  --listen 127.0.0.1:0 --poll-interval 600s --render-timeout 1800s "$@" >"$log" 2>&1 &
pid=$!
deadline=$(( $(date +%s) + 600 ))
until [ "$(served)" -gt 0 ]; do
  if ! kill -0 "$pid" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
    cat "$log"
    exit 1
  fi
  sleep 0.2
done
sleep 3
echo "first render served; hub RSS $(rss) KB"
for i in $(seq 1 "$runs"); do
  sleep "${GAP:-0}"
  before="$(served)"
  sed -i 's/^    site: "\(.*\)"/    site: "\1x"/' "$repo/$file"
  start=$(date +%s%N)
  git -C "$repo" -c user.email=bench@flotilla.invalid -c user.name=bench \
    commit -qam "commit-latency $i"
  until [ "$(served)" -gt "$before" ]; do sleep 0.01; done
  end=$(date +%s%N)
  line="$(grep "serving the new render" "$log" | tail -1)"
  figures="$(grep -o 'render_ms=[0-9]*\|install_ms=[0-9]*\|changed=[0-9]*' <<<"$line" | tr '\n' ' ')"
  echo "commit $i: $(( (end - start) / 1000000 )) ms to served; ${figures}hub RSS $(rss) KB"
done
