#!/usr/bin/env python3
"""The real Helm v4 engine in-process, for the Helm fleet benchmark (BENCHMARKS.md).

Renders one chart N times, each time with its own values (as every cluster of a fleet
has its own), through helm-python-sdk (Helm's Go SDK behind a C ABI), and prints the
median time a release takes, in two ways:

- "load+render": the chart loaded afresh and rendered, per release (what the corpus
  in ../shared/testdata/helm-charts does: the engine drops disabled subcharts from a
  loaded chart, so a loaded chart is not reused there);
- "render": the chart loaded once, then only `Chart.render` per release.

The chart is read at run time from an archive (a corpus `source.tar.gz` or any chart
`.tgz`) and unpacked into a temporary folder: no chart data is kept in this
repository.

    python3 -m venv /tmp/helmpy && /tmp/helmpy/bin/pip install helm-python-sdk
    /tmp/helmpy/bin/python benches/helm_reference.py CHART.tgz [--renders N]
        [--values JSON] [--release NAME] [--namespace NS] [--check-cluster NAME]

--values is a JSON object in which "{cluster}" is replaced by each cluster's name
(edge-00000, edge-00001, ...), as helm_fleet's `one` does; the default is Bitnami's
commonLabels and commonAnnotations.
"""

import argparse
import json
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import helm_python

DEFAULT_VALUES = (
    '{"commonLabels": {"example.com/site": "{cluster}"}, '
    '"commonAnnotations": {"example.com/site": "{cluster}"}}'
)


def cluster_name(index):
    return f"edge-{index:05d}"


def values_for(template, cluster):
    return json.loads(template.replace("{cluster}", cluster))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    parser.add_argument("--renders", type=int, default=100)
    parser.add_argument("--values", default=DEFAULT_VALUES)
    parser.add_argument("--release")
    parser.add_argument("--namespace")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="helm-reference-") as tmp:
        with tarfile.open(args.archive) as tar:
            tar.extractall(tmp, filter="data")
        (chart_dir,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        release = args.release or chart_dir.name
        namespace = args.namespace or release

        # One render first (the library's start-up), not timed.
        helm_python.Chart.load(chart_dir).render(
            values_for(args.values, cluster_name(0)), name=release, namespace=namespace
        )

        load_render, render_only, sizes = [], [], []
        loaded = helm_python.Chart.load(chart_dir)
        for i in range(args.renders):
            values = values_for(args.values, cluster_name(i))
            # Alternate the two ways, so both see the same machine.
            started = time.perf_counter()
            chart = helm_python.Chart.load(chart_dir)
            out = chart.render(values, name=release, namespace=namespace)
            load_render.append(time.perf_counter() - started)
            chart.close()
            started = time.perf_counter()
            out2 = loaded.render(values, name=release, namespace=namespace)
            render_only.append(time.perf_counter() - started)
            assert out == out2, "a reused chart renders as a fresh one"
            sizes.append(sum(len(t) for t in out.values()))
        assert cluster_name(args.renders - 1) in "".join(out.values()), (
            "the cluster's name reaches the output"
        )

        def ms(xs):
            return statistics.median(xs) * 1000

        print(
            f"helm-python-sdk {helm_python.__version__}, Helm SDK "
            f"{helm_python.helm_sdk_version()}: chart {chart_dir.name}, {args.renders} "
            f"releases with values of their own, {statistics.median(sizes):.0f} bytes "
            "of output each"
        )
        print(
            f"load+render: median {ms(load_render):.2f} ms a release "
            f"(min {min(load_render) * 1000:.2f}, max {max(load_render) * 1000:.2f})"
        )
        print(
            f"render: median {ms(render_only):.2f} ms a release "
            f"(min {min(render_only) * 1000:.2f}, max {max(render_only) * 1000:.2f})"
        )


if __name__ == "__main__":
    main()
