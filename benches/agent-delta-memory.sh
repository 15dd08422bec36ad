#!/usr/bin/env bash
# The agent's peak memory when it takes a bundle whole and when it takes a change as
# a delta, against a `flotilla publish --deltas` folder (file://).
#
#   cargo build --release --bin flotilla && benches/agent-delta-memory.sh
#   AGENT_BIN=target/release/flotilla-agent benches/agent-delta-memory.sh   # the edge agent
#   RESOURCES=100000 AGENT_BIN=… benches/agent-delta-memory.sh   # many small resources
#   CONFIGMAPS=600 AGENT_BIN=… benches/agent-delta-memory.sh      # a 30 MB bundle
#
# Makes a fleet of one cluster whose bundle is 200 ConfigMaps (or CONFIGMAPS) of 50,000
# hexadecimal characters (about 10 MB), or with RESOURCES=N, N small ConfigMaps (100,000 make a
# bundle of about 12 MB, where each resource's own cost outweighs its bytes),
# publishes it with deltas, runs the agent with the dir
# sink until it has applied it, and prints VmHWM and VmRSS; then changes one field,
# publishes again (the agent takes the change as a delta from the bundle it runs)
# and prints them again once that is applied. Each reading is taken 3 s after the apply,
# so that it also covers the agent's next reads of the folder (once per `--wait 1s`):
# the first of them rebuilds the delta from the new bundle to itself.
set -euo pipefail
cd "$(dirname "$0")/.."

flotilla="${FLOTILLA_BIN:-target/release/flotilla}"
agent="${AGENT_BIN:-$flotilla}"
work="$(mktemp -d)"
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

fleet="$work/fleet"
mkdir -p "$fleet/clusters" "$fleet/workloads/big/manifests"
cat > "$fleet/clusters/edge-1.yaml" <<'YAML'
apiVersion: flotilla.dev/v1alpha1
kind: Cluster
metadata:
  name: edge-1
YAML
cat > "$fleet/workloads/big/workload.yaml" <<'YAML'
apiVersion: flotilla.dev/v1alpha1
kind: Workload
metadata:
  name: big
spec:
  namespace: big
  targets:
    - clusterSelector: {}
YAML
resources="${RESOURCES:-0}"
python3 - "$fleet/workloads/big/manifests" "$resources" "${CONFIGMAPS:-200}" <<'PY'
import random, sys
random.seed(7)
out, small, large = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if small:
    # A thousand ConfigMaps to a file; the one the change edits is cm-big-0000100.
    for start in range(0, small, 1000):
        with open(f'{out}/cms-{start // 1000:04}.yaml', 'w') as f:
            for i in range(start, min(start + 1000, small)):
                f.write(f"---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-big-{i:07}\n"
                        f"data:\n  level: info\n  index: \"{i}\"\n")
else:
    for i in range(large):
        blob = ''.join('%08x' % random.getrandbits(32) for _ in range(6250))
        with open(f'{out}/cm-{i:03}.yaml', 'w') as f:
            f.write(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i:03}\n"
                    f"data:\n  level: info\n  blob: {blob}\n")
PY

mirror="$work/mirror"
digest() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['digest'])" "$mirror/v1/clusters/edge-1/bundle"; }
applied() { until grep -q "\"applied\": *\"$1\"" "$work/state/status.json" 2>/dev/null; do sleep 0.2; done; }
memory() { grep -E 'VmHWM|VmRSS' "/proc/$pid/status" | tr -s ' \t' ' ' | tr '\n' ' '; echo; }

"$flotilla" publish --repo "$fleet" --out "$mirror" --deltas 3 > /dev/null 2>&1
echo "bundle: $(stat -c %s "$mirror/v1/clusters/edge-1/bundle") bytes"
agent_args=(--server "file://$mirror" --cluster edge-1 --state-dir "$work/state" --sink "dir:$work/out" --wait 1s)
if [[ "$(basename "$agent")" == "flotilla" ]]; then
  "$agent" agent "${agent_args[@]}" > "$work/agent.log" 2>&1 &
else
  "$agent" "${agent_args[@]}" > "$work/agent.log" 2>&1 &
fi
pid=$!
started=$(date +%s.%N)
first="$(digest)"
applied "$first"
echo "applied whole in $(echo "$(date +%s.%N) - $started" | bc) s (from the agent's start)"
sleep 3
echo "after the bundle taken whole: $(memory)"

if (( resources )); then
  python3 - "$fleet/workloads/big/manifests/cms-0000.yaml" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
open(path, 'w').write(text.replace("name: cm-big-0000100\ndata:\n  level: info", "name: cm-big-0000100\ndata:\n  level: debug"))
PY
else
  sed -i 's/level: info/level: debug/' "$fleet/workloads/big/manifests/cm-100.yaml"
fi
"$flotilla" publish --repo "$fleet" --out "$mirror" --deltas 3 > /dev/null 2>&1
second="$(digest)"
echo "delta from the bundle it runs: $(stat -c %s "$mirror/v1/clusters/edge-1/deltas/$first") bytes"
started=$(date +%s.%N)
applied "$second"
echo "applied the delta in $(echo "$(date +%s.%N) - $started" | bc) s (from its publish)"
grep -q "received as a delta" "$work/state/status.json" || { echo "the change did not come as a delta" >&2; exit 1; }
sleep 3
echo "after the change taken as a delta: $(memory)"
