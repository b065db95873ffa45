#!/usr/bin/env python3
"""Checks what `kubectl kustomize` made of one kustomization under deploy/ (YAML on stdin).

deploy_check.py KIND NAME: KIND is overlay (the whole of freeflow: deploy/overlays/NAME),
examples (deploy/examples), monitoring (deploy/monitoring) or device-plugin
(deploy/device-plugin/overlays/NAME). Prints
one line per failed check and exits 1 if any failed.
"""
import json
import sys

import yaml

FAILS = []
METRICS_PORT = 9478  # the router's /metrics (docs/metrics.md)


def check(cond, what):
    if not cond:
        FAILS.append(what)
    return cond


def find(docs, kind, name):
    for d in docs:
        if d.get("kind") == kind and d.get("metadata", {}).get("name") == name:
            return d
    return None


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def check_router(docs, name):
    ds = find(docs, "DaemonSet", "freeflow-router")
    if not check(ds is not None, "no DaemonSet freeflow-router"):
        return
    spec = ds["spec"]["template"]["spec"]
    check(spec.get("hostNetwork") is True, "router: hostNetwork (pods' veths link to it)")
    check(spec.get("hostPID") is True, "router: hostPID (it names pods' processes by pid)")
    c = spec["containers"][0]
    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    check(caps.get("drop") == ["ALL"], "router: capabilities drop ALL")
    check(sorted(caps.get("add", [])) == ["SYS_ADMIN", "SYS_PTRACE"],
          "router: adds exactly SYS_ADMIN and SYS_PTRACE, got %s" % caps.get("add"))
    check(sc.get("privileged") is not True, "router: not privileged")
    check(sc.get("readOnlyRootFilesystem") is True, "router: read-only root file system")
    check(sc.get("allowPrivilegeEscalation") is False, "router: no privilege escalation")
    check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "router: seccomp")
    check("livenessProbe" in c and "startupProbe" in c, "router: health probes")
    # An update starts the new router beside the old one, which hands over (docs/handover.md):
    # no host ports to clash, ready only once it serves, the old pod deleted after.
    ru = ds["spec"].get("updateStrategy", {}).get("rollingUpdate", {})
    check(ru.get("maxSurge") == 1 and ru.get("maxUnavailable") == 0,
          "router: updates surge (maxSurge 1, maxUnavailable 0), got %s" % ru)
    check(not c.get("ports"), "router: no ports (host ports: an update's second pod cannot get them)")
    ready = env_of(c).get("FREEFLOW_READY_FILE", {}).get("value", "")
    check(env_of(c).get("FREEFLOW_TAKE_OVER", {}).get("value") == "true",
          "router: FREEFLOW_TAKE_OVER")
    check(ready != "" and c.get("readinessProbe", {}).get("exec", {}).get("command") ==
          ["/bin/test", "-e", ready], "router: the readiness probe tests FREEFLOW_READY_FILE")
    check("cpu" in c.get("resources", {}).get("requests", {}), "router: resource requests")
    # Metrics on the node's address (docs/metrics.md), on the port the annotations name.
    ann = ds["spec"]["template"]["metadata"].get("annotations", {})
    check(env_of(c).get("FREEFLOW_METRICS_ADDRESS", {}).get("value") ==
          "$(HOST_IP):%s" % METRICS_PORT,
          "router: FREEFLOW_METRICS_ADDRESS on HOST_IP at its metrics port")
    check(ann.get("prometheus.io/scrape") == "true" and
          ann.get("prometheus.io/port") == str(METRICS_PORT),
          "router: prometheus.io annotations name the metrics port")
    env = env_of(c)
    field = lambda n: env.get(n, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    check(field("NODE_NAME") == "spec.nodeName", "router: NODE_NAME from the downward API")
    check(field("HOST_IP") == "status.hostIP", "router: HOST_IP from the downward API")
    refs = [e.get("configMapRef", {}).get("name") for e in c.get("envFrom", [])]
    check("freeflow-router" in refs, "router: settings from ConfigMap freeflow-router")
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in mounts:
        check(m in volumes, "router: mount %s has no volume" % m)
    check(volumes.get("freeflow", {}).get("hostPath", {}).get("path") == "/freeflow",
          "router: the node's /freeflow")
    check(mounts.get("freeflow", {}).get("mountPath") == "/freeflow", "router: at /freeflow")
    cm = find(docs, "ConfigMap", "freeflow-router")
    if not check(cm is not None, "no ConfigMap freeflow-router"):
        return
    data = cm.get("data", {})
    check("VNET_PREFIX" in data, "freeflow-router: VNET_PREFIX")
    plane = data.get("FREEFLOW_CONTROL_PLANE", "")
    if name == "single-node":
        check(plane == "", "single-node: no control plane")
    if name == "static":
        check(plane.startswith("static:/etc/freeflow/control-plane/"), "static: control plane")
        cp = find(docs, "ConfigMap", "freeflow-control-plane")
        if check(cp is not None, "static: no ConfigMap freeflow-control-plane"):
            nodes = json.loads(cp["data"]["cluster.json"]).get("nodes", [])
            check(len(nodes) >= 2 and all("podCIDRs" in n for n in nodes),
                  "static: cluster.json names nodes and their pod CIDRs")
    if name == "etcd":
        check(plane.startswith("etcd:https://"), "etcd: control plane over TLS")
        check(data.get("ETCDCTL_CACERT", "").startswith(
            mounts.get("etcd-tls", {}).get("mountPath", "?")), "etcd: its CA in the Secret")
        # Each router is its own etcd user: its node's certificate, by its node name.
        node_tls = mounts.get("node-tls", {}).get("mountPath", "?")
        for flag, ext in (("--etcd-cert=", ".crt"), ("--etcd-key=", ".key")):
            check(flag + node_tls + "/$(NODE_NAME)" + ext in c.get("args", []),
                  "etcd: %s the node's own certificate" % flag)


def check_device_plugin(docs, mode):
    ds = find(docs, "DaemonSet", "rdma-device-plugin")
    if not check(ds is not None, "no DaemonSet rdma-device-plugin"):
        return
    c = ds["spec"]["template"]["spec"]["containers"][0]
    check(c.get("command") == ["/usr/local/bin/rdma-device-plugin"], "device plugin: command")
    cm = find(docs, "ConfigMap", "rdma-device-plugin-config")
    if check(cm is not None, "no device plugin ConfigMap") and mode == "virtual":
        entries = json.loads(cm["data"]["config.json"]).get("configList", [])
        check(any(e.get("mode") == "virtual" and e.get("resourcePrefix") == "freeflow"
                  for e in entries), "device plugin: virtual mode, freeflow/vrdma")


def check_monitoring(docs):
    svc = find(docs, "Service", "freeflow-router-metrics")
    mon = find(docs, "ServiceMonitor", "freeflow-router")
    if check(svc is not None, "monitoring: no Service freeflow-router-metrics"):
        spec = svc["spec"]
        check(spec.get("selector") == {"app.kubernetes.io/name": "freeflow-router"},
              "monitoring: the Service selects the router pods")
        check([(p.get("name"), p.get("targetPort")) for p in spec.get("ports", [])] ==
              [("metrics", METRICS_PORT)], "monitoring: the Service's port is the router's metrics port")
    if check(mon is not None, "monitoring: no ServiceMonitor freeflow-router"):
        ends = mon["spec"].get("endpoints", [])
        check(any(e.get("port") == "metrics" and e.get("path") == "/metrics" for e in ends),
              "monitoring: the ServiceMonitor scrapes /metrics")


def check_examples(docs):
    pods = [d for d in docs if d.get("kind") == "Pod"]
    check(len(pods) >= 4, "examples: two pairs of pods")
    for p in pods:
        n = p["metadata"]["name"]
        psc = p["spec"].get("securityContext", {})
        check(psc.get("runAsNonRoot") is True, "%s: runs as non-root" % n)
        for c in p["spec"]["containers"]:
            sc = c.get("securityContext", {})
            check(c["resources"]["limits"].get("freeflow/vrdma") == 1, "%s: freeflow/vrdma: 1" % n)
            check(sc.get("capabilities", {}).get("drop") == ["ALL"], "%s: drops ALL" % n)
            check(sc.get("readOnlyRootFilesystem") is True, "%s: read-only root" % n)
            check(not c.get("volumeMounts"), "%s: no mounts of its own" % n)


def main():
    kind, name = sys.argv[1], sys.argv[2]
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    if kind == "overlay":
        check_router(docs, name)
        check_device_plugin(docs, "virtual")
    elif kind == "device-plugin":
        check_device_plugin(docs, name)
    elif kind == "examples":
        check_examples(docs)
    elif kind == "monitoring":
        check_monitoring(docs)
    else:
        FAILS.append("unknown kind " + kind)
    for f in FAILS:
        print("FAIL %s %s: %s" % (kind, name, f))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
