#!/usr/bin/env python3
"""The cluster admin's part for the two-node end-to-end run (tests/e2e/run.sh): what
deploy/overlays/static asks of whoever installs it, done to the YAML `kubectl kustomize`
built, as `kubectl edit` and `kubectl create secret` would do it on a cluster.

  cluster_admin.py MANIFEST CLUSTER_JSON TLS_DIR NODE...
      Replaces cluster.json in ConfigMap freeflow-control-plane with CLUSTER_JSON's text and
      adds Secret freeflow-node-tls holding TLS_DIR/ca.crt and each NODE's .crt and .key
      (never the CA's key). Prints the result.
"""
import base64
import os
import sys

import yaml


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    manifest, cluster_json, tls, nodes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    with open(manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    planes = [d for d in docs if d["kind"] == "ConfigMap"
              and d["metadata"]["name"] == "freeflow-control-plane"]
    if len(planes) != 1:
        sys.exit("cluster_admin: no ConfigMap freeflow-control-plane in " + manifest)
    with open(cluster_json) as f:
        planes[0]["data"]["cluster.json"] = f.read()
    files = ["ca.crt"] + [n + ext for n in nodes for ext in (".crt", ".key")]
    data = {}
    for name in files:
        with open(os.path.join(tls, name), "rb") as f:
            data[name] = base64.b64encode(f.read()).decode()
    docs.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                 "metadata": {"name": "freeflow-node-tls", "namespace": "kube-system"},
                 "data": data})
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
