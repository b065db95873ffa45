#!/usr/bin/env python3
"""kubelet's translations for the end-to-end run (tests/e2e/run.sh), printed as `ctr run`
options, one per line, then `--` and the command (for `daemonset`):

  kubelet_spec.py daemonset MANIFEST NAME NODE_ROOT NODE_NAME NODE_IP NETNS PIDNS
      The container of DaemonSet NAME in MANIFEST (what `kubectl kustomize` built), started
      as kubelet and containerd's CRI would on a node whose root is NODE_ROOT (every
      hostPath P is NODE_ROOT/P, but for /sys and /dev): hostNetwork joins NETNS, hostPID
      joins PIDNS, the securityContext becomes capabilities, seccomp and a read-only root,
      env (downward API, $(VAR) references, also in command and args) and envFrom
      ConfigMaps become --env, volumes
      become bind mounts (ConfigMaps and Secrets in MANIFEST written under
      NODE_ROOT/volumes; an optional one that is not there is an empty folder), and
      resources.limits.memory the container's memory cgroup limit (CPU requests and limits
      are not translated: the run's containers share the machine's CPUs unweighted).
  kubelet_spec.py probe MANIFEST NAME KIND
      The exec command of probe KIND (startupProbe, livenessProbe, readinessProbe) of
      DaemonSet NAME's container, one argument per line, as kubelet runs it in the container.
  kubelet_spec.py allocate RESPONSE_JSON NODE_ROOT
      A ContainerAllocateResponse (ff-kubelet-allocate's output) as kubelet applies it to a
      container: mounts, environment, device nodes, annotations.

Fails loudly on anything it cannot translate faithfully, rather than run something else.
"""
import base64
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml



def default_caps():
    """containerd's default capability set (ctr takes no "ALL": each is dropped by name)."""
    spec = json.loads(subprocess.run(["ctr", "oci", "spec"], check=True, capture_output=True,
                                     text=True).stdout)
    return spec["process"]["capabilities"]["bounding"]

HOST_SHARED = ("/sys", "/dev")  # the real node's, read-only


def die(why):
    sys.exit("kubelet_spec: " + why)


def host_path(root, path):
    if path in HOST_SHARED:
        return path
    return os.path.join(root, path.lstrip("/"))


def find(docs, kind, name):
    for d in docs:
        if d and d.get("kind") == kind and d["metadata"]["name"] == name:
            return d
    die("no %s %s in the manifest" % (kind, name))


def security_options(sc):
    out = []
    if sc.get("privileged"):
        die("a privileged container is not what freeflow runs")
    if sc.get("readOnlyRootFilesystem"):
        out.append("--read-only")
    if sc.get("seccompProfile", {}).get("type") == "RuntimeDefault":
        out.append("--seccomp")
    if sc.get("allowPrivilegeEscalation", True):
        out.append("--allow-new-privs")
    caps = sc.get("capabilities", {})
    if caps.get("drop") == ["ALL"]:
        for c in default_caps():
            out += ["--cap-drop", c]
    elif caps.get("drop"):
        die("only drop: [ALL] is translated")
    for c in caps.get("add", []):
        out += ["--cap-add", "CAP_" + c]
    return out


def expand(text, env):
    """Kubernetes' $(VAR) references to the container's variables; others stay as they are."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def container_env(docs, c, node_name, node_ip):
    env = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef")
        if not ref:
            die("only envFrom configMapRef is translated")
        env.update(find(docs, "ConfigMap", ref["name"]).get("data", {}))
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        src = e["valueFrom"]
        field = src.get("fieldRef", {}).get("fieldPath")
        if field == "spec.nodeName":
            env[e["name"]] = node_name
        elif field == "status.hostIP":
            env[e["name"]] = node_ip
        elif src.get("secretKeyRef", {}).get("optional"):
            continue  # no such Secret on this node: the variable is left out, as kubelet does
        else:
            die("cannot translate env %s" % e["name"])
    return env


def volume_source(docs, v, root):
    if "emptyDir" in v:
        # The pod's own, new for each pod (here each container) as kubelet makes it.
        base = os.path.join(root, "volumes", "empty")
        os.makedirs(base, mode=0o755, exist_ok=True)
        return tempfile.mkdtemp(prefix=v["name"] + "-", dir=base)
    if "hostPath" in v:
        path = host_path(root, v["hostPath"]["path"])
        if v["hostPath"].get("type") == "DirectoryOrCreate":
            os.makedirs(path, mode=0o755, exist_ok=True)
        return path
    # ConfigMaps and Secrets: their files in a folder of their own; an optional one that does
    # not exist is an empty folder.
    folder = os.path.join(root, "volumes", v["name"])
    os.makedirs(folder, mode=0o755, exist_ok=True)
    if "configMap" in v:
        cm = [d for d in docs if d and d.get("kind") == "ConfigMap"
              and d["metadata"]["name"] == v["configMap"]["name"]]
        if not cm and not v["configMap"].get("optional"):
            die("ConfigMap %s is missing" % v["configMap"]["name"])
        for key, text in (cm[0].get("data", {}) if cm else {}).items():
            with open(os.path.join(folder, key), "w") as f:
                f.write(text)
    elif "secret" in v:
        secret = [d for d in docs if d and d.get("kind") == "Secret"
                  and d["metadata"]["name"] == v["secret"]["secretName"]]
        if not secret and not v["secret"].get("optional"):
            die("Secret %s is missing" % v["secret"]["secretName"])
        mode = v["secret"].get("defaultMode", 0o644)
        for key, text in (secret[0].get("data", {}) if secret else {}).items():
            path = os.path.join(folder, key)
            with open(path, "wb") as f:
                f.write(base64.b64decode(text))
            os.chmod(path, mode)
    else:
        die("cannot translate volume %s" % v["name"])
    return folder


QUANTITY_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                     "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def memory_bytes(quantity):
    """A Kubernetes memory quantity ("4Gi", "512M", "1073741824") in bytes."""
    m = re.fullmatch(r"([0-9]+)([kMGT]i?|)", str(quantity))
    if not m or m.group(2) not in QUANTITY_SUFFIXES:
        die("cannot translate memory quantity %s" % quantity)
    return int(m.group(1)) * QUANTITY_SUFFIXES[m.group(2)]


def daemonset(manifest, name, root, node_name, node_ip, netns, pidns):
    with open(manifest) as f:
        docs = list(yaml.safe_load_all(f))
    spec = find(docs, "DaemonSet", name)["spec"]["template"]["spec"]
    if len(spec["containers"]) != 1:
        die("one container per DaemonSet is translated")
    c = spec["containers"][0]
    out = []
    if spec.get("hostNetwork"):
        out += ["--with-ns", "network:" + netns]
    if spec.get("hostPID"):
        out += ["--with-ns", "pid:" + pidns]
    out += security_options(c.get("securityContext", {}))
    limit = c.get("resources", {}).get("limits", {}).get("memory")
    if limit is not None:
        out += ["--memory-limit", str(memory_bytes(limit))]
    env = container_env(docs, c, node_name, node_ip)
    for k, v in env.items():
        out += ["--env", "%s=%s" % (k, v)]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        src = volume_source(docs, volumes[m["name"]], root)
        mode = "ro" if m.get("readOnly") else "rw"
        out.append("--mount=type=bind,src=%s,dst=%s,options=rbind:%s" % (src, m["mountPath"], mode))
    return out + ["--"] + [expand(a, env) for a in c.get("command", []) + c.get("args", [])]


def allocate(response, root):
    with open(response) as f:
        r = json.load(f)
    out = []
    for m in r.get("mounts", []):
        mode = "ro" if m.get("readOnly") else "rw"
        out.append("--mount=type=bind,src=%s,dst=%s,options=rbind:%s"
                   % (host_path(root, m["hostPath"]), m["containerPath"], mode))
    for k, v in sorted(r.get("envs", {}).items()):
        out += ["--env", "%s=%s" % (k, v)]
    for d in r.get("devices", []):
        if d["hostPath"] != d["containerPath"]:
            die("ctr adds a device node only at its own path")
        out += ["--device", d["hostPath"]]
    for k, v in sorted(r.get("annotations", {}).items()):
        out += ["--annotation", "%s=%s" % (k, v)]
    if r.get("cdiDevices"):
        die("CDI devices need a CDI-aware runtime; this run has none")
    return out


def probe(manifest, name, kind):
    with open(manifest) as f:
        docs = list(yaml.safe_load_all(f))
    c = find(docs, "DaemonSet", name)["spec"]["template"]["spec"]["containers"][0]
    command = c.get(kind, {}).get("exec", {}).get("command")
    if not command:
        die("DaemonSet %s has no exec %s" % (name, kind))
    return command


def main():
    if len(sys.argv) == 9 and sys.argv[1] == "daemonset":
        out = daemonset(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "probe":
        out = probe(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "allocate":
        out = allocate(*sys.argv[2:])
    else:
        die(__doc__)
    print("\n".join(out))


if __name__ == "__main__":
    main()
