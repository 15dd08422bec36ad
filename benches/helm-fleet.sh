#!/usr/bin/env bash
# Helm at fleet scale (BENCHMARKS.md, "Helm charts at fleet scale"): flotilla's Helm
# engine against the real one, side by side in one run.
#
#   benches/helm-fleet.sh [CORPUS] [ROUNDS]
#
# CORPUS is ../shared/testdata/helm-charts (third-party charts, read at run time,
# never copied here); ROUNDS (default 3) rounds each run, alternating:
#   1. helm_fleet one: a chart, 10,000 clusters, every one with its own values (an
#      overlay per cluster with helmValues; then a site.yaml.j2 values file), under
#      /usr/bin/time for wall time and peak RSS;
#   2. benches/helm_reference.py: the real Helm v4 engine (helm-python-sdk) rendering
#      the same chart with the same kind of values, per release;
# for bitnami-fluentd (the size of ingress-nginx: about 50-80 ms a release in Helm)
# and bitnami-haproxy; then once:
#   3. helm_fleet shared: 5 charts × 4 workloads with values per group, against the
#      same fleet written as plain manifests (alternating inside the process).
#
# Needs: cargo build --release --locked -p flotilla-render --example helm_fleet, and
# python3 -m venv /tmp/helmpy && /tmp/helmpy/bin/pip install helm-python-sdk.
# CLUSTERS (default 10000), SHARED_CLUSTERS (default 10000) and CHARTS (default
# "bitnami-fluentd bitnami-haproxy") can be set in the environment.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
corpus=${1:-$here/../shared/testdata/helm-charts}
rounds=${2:-3}
clusters=${CLUSTERS:-10000}
shared_clusters=${SHARED_CLUSTERS:-10000}
charts=${CHARTS:-bitnami-fluentd bitnami-haproxy}
bin=$here/target/release/examples/helm_fleet
python=${HELM_PYTHON:-/tmp/helmpy/bin/python}

[ -x "$bin" ] || { echo "build it first: cargo build --release --locked -p flotilla-render --example helm_fleet" >&2; exit 1; }
[ -d "$corpus" ] || { echo "no corpus at $corpus" >&2; exit 1; }

commit=$(git -C "$here" rev-parse HEAD 2>/dev/null || cat "$here/COMMIT" 2>/dev/null || echo unknown)
echo "commit $commit, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for chart in $charts; do
    archive=$corpus/$chart/source.tar.gz
    for round in $(seq 1 "$rounds"); do
        for mode in overlay j2; do
            echo "== $chart round $round: flotilla, $clusters clusters, values per cluster by $mode"
            /usr/bin/time -f 'process: %e s wall, %U s user, %S s sys, %M KB max RSS' \
                "$bin" one "$archive" --clusters "$clusters" --per-cluster "$mode" 2>&1 | grep -v '^warning'
        done
        echo "== $chart round $round: Helm v4 (helm-python-sdk)"
        "$python" "$here/benches/helm_reference.py" "$archive" --renders 100
    done
    # The control: the same fleets with the same values for every cluster (one
    # release rendered, shared by all): what everything but the Helm renders costs.
    for mode in overlay j2; do
        echo "== $chart control: flotilla, $clusters clusters, the same values for all, by $mode"
        /usr/bin/time -f 'process: %e s wall, %U s user, %S s sys, %M KB max RSS' \
            "$bin" one "$archive" --clusters "$clusters" --per-cluster "$mode" \
            --values '{"commonLabels": {"example.com/site": "same"}, "commonAnnotations": {"example.com/site": "same"}}' \
            2>&1 | grep -v '^warning'
    done
done

echo "== shared: 5 charts × 4 workloads, values per group, $shared_clusters clusters"
by_pod='{"podLabels": {"example.com/group": "{group}"}, "podAnnotations": {"example.com/group": "{group}"}}'
by_custom='{"customLabels": {"example.com/group": "{group}"}}'
/usr/bin/time -f 'process: %e s wall, %U s user, %S s sys, %M KB max RSS' \
    "$bin" shared \
    "$corpus/bitnami-haproxy/source.tar.gz" \
    "$corpus/bitnami-memcached/source.tar.gz" \
    "$corpus/bitnami-metrics-server/source.tar.gz" \
    "$corpus/prometheus-statsd-exporter/source.tar.gz=$by_pod" \
    "$corpus/prometheus-redis-exporter/source.tar.gz=$by_custom" \
    --clusters "$shared_clusters" --runs "$rounds"
