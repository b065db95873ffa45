#!/usr/bin/env python3
"""The cluster admin's part for the two-node end-to-end run (tests/e2e/run.sh): what
deploy/overlays/static and deploy/overlays/etcd ask of whoever installs them, done to the
YAML `kubectl kustomize` built, as `kubectl edit` and `kubectl create secret` would do it on
a cluster. Prints the result.

  cluster_admin.py MANIFEST TLS_DIR NODES [--cluster-json FILE] [--control-plane URL]
                   [--etcd-ca FILE]
      Adds Secret freeflow-node-tls holding TLS_DIR/ca.crt and each node's .crt and .key
      (NODES comma-separated; never the CA's key). --cluster-json: the text of cluster.json
      in ConfigMap freeflow-control-plane (static). --control-plane: FREEFLOW_CONTROL_PLANE
      in ConfigMap freeflow-router, and --etcd-ca: Secret freeflow-etcd-tls with etcd's CA
      as ca.crt (etcd).
"""
import argparse
import base64
import os
import sys

import yaml


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    if len(found) != 1:
        sys.exit("cluster_admin: no %s %s in the manifest" % (kind, name))
    return found[0]


def secret(name, files):
    data = {}
    for key, path in files.items():
        with open(path, "rb") as f:
            data[key] = base64.b64encode(f.read()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": "kube-system"}, "data": data}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest")
    ap.add_argument("tls_dir")
    ap.add_argument("nodes")
    ap.add_argument("--cluster-json")
    ap.add_argument("--control-plane")
    ap.add_argument("--etcd-ca")
    a = ap.parse_args()
    with open(a.manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if a.cluster_json:
        with open(a.cluster_json) as f:
            one(docs, "ConfigMap", "freeflow-control-plane")["data"]["cluster.json"] = f.read()
    if a.control_plane:
        one(docs, "ConfigMap", "freeflow-router")["data"]["FREEFLOW_CONTROL_PLANE"] = a.control_plane
    if a.etcd_ca:
        docs.append(secret("freeflow-etcd-tls", {"ca.crt": a.etcd_ca}))
    names = ["ca.crt"] + [n + ext for n in a.nodes.split(",") for ext in (".crt", ".key")]
    docs.append(secret("freeflow-node-tls", {n: os.path.join(a.tls_dir, n) for n in names}))
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
