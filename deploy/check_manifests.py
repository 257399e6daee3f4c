#!/usr/bin/env python3
"""Checks deploy/k8s/*.yaml: every file parses, holds the kinds it should, and the files
agree with each other (names, labels, the ConfigMap's variables, slots and workers).

    python3 deploy/check_manifests.py        # needs PyYAML (pip install pyyaml)

Not run by CI; a check to run after editing the manifests. For schema validation on top,
`pip install kubernetes-validate` and run `kubernetes-validate deploy/k8s/*.yaml`.
"""

import pathlib
import re
import sys

import yaml

K8S = pathlib.Path(__file__).resolve().parent / "k8s"

EXPECTED = {
    "pvc.yaml": ["PersistentVolumeClaim"],
    "configmap.yaml": ["ConfigMap"],
    "service.yaml": ["Service"],
    "workers.yaml": ["Service", "StatefulSet"],
    "coordinator-job.yaml": ["Job"],
    "coordinator-deployment.yaml": ["Deployment"],
    "toolbox.yaml": ["Pod"],
    "networkpolicy.yaml": ["NetworkPolicy"],
}

problems = []


def check(ok, message):
    if not ok:
        problems.append(message)


docs = {}
for path in sorted(K8S.glob("*.yaml")):
    try:
        loaded = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        problems.append(f"{path.name}: does not parse: {e}")
        continue
    docs[path.name] = loaded
    kinds = [d.get("kind") for d in loaded]
    check(kinds == EXPECTED.get(path.name), f"{path.name}: kinds {kinds}, expected {EXPECTED.get(path.name)}")
    for d in loaded:
        check("namespace" not in d.get("metadata", {}), f"{path.name}: names a namespace")
        check(d.get("apiVersion") and d.get("metadata", {}).get("name"), f"{path.name}: no apiVersion or name")
check(set(docs) == set(EXPECTED), f"files {sorted(docs)}, expected {sorted(EXPECTED)}")
if problems:
    sys.exit("\n".join(problems))


def one(file, kind):
    return next(d for d in docs[file] if d["kind"] == kind)


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


config = one("configmap.yaml", "ConfigMap")
env = config["data"]
check(all(isinstance(v, str) for v in env.values()), "configmap.yaml: every value must be a string")
pvc = one("pvc.yaml", "PersistentVolumeClaim")
check(pvc["spec"]["accessModes"] == ["ReadWriteMany"], "pvc.yaml: the volume must be ReadWriteMany")
service = one("service.yaml", "Service")
check(service["spec"].get("type", "ClusterIP") == "ClusterIP", "service.yaml: not ClusterIP")
sts = one("workers.yaml", "StatefulSet")
job = one("coordinator-job.yaml", "Job")
deployment = one("coordinator-deployment.yaml", "Deployment")
toolbox = one("toolbox.yaml", "Pod")
pods = {"workers": sts["spec"]["template"], "job": job["spec"]["template"],
        "deployment": deployment["spec"]["template"], "toolbox": toolbox}

for name, pod in pods.items():
    spec = pod["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
    check(claims == [pvc["metadata"]["name"]], f"{name}: mounts claims {claims}")
    for c in spec["containers"]:
        check(c["image"] == "weir-file-sum:latest", f"{name}: image {c['image']}")
        check("command" not in c, f"{name}: `command` would bypass tini; use args")
        refs = [e["configMapRef"]["name"] for e in c.get("envFrom", [])]
        check(all(r == config["metadata"]["name"] for r in refs), f"{name}: envFrom {refs}")
        for arg in c.get("args", []):
            for var in re.findall(r"\$\((\w+)\)", arg):
                check(var in env, f"{name}: args use $({var}), which configmap.yaml lacks")
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        check("/data" in mounts, f"{name}: /data not mounted")
        if c.get("securityContext", {}).get("readOnlyRootFilesystem"):
            check("/tmp" in mounts, f"{name}: read-only root without a writable /tmp")
    for p in ("WEIR_INPUT", "WEIR_OUTPUT", "WEIR_CHECKPOINT_DIR"):
        check(env[p].startswith("/data/"), f"configmap.yaml: {p} is not on the shared volume")

# The workers.
check(sts["spec"]["podManagementPolicy"] == "Parallel", "workers.yaml: podManagementPolicy is not Parallel")
check(matches(sts["spec"]["selector"]["matchLabels"], sts["spec"]["template"]["metadata"]["labels"]),
      "workers.yaml: the selector does not match the pod labels")
governing = one("workers.yaml", "Service")
check(governing["metadata"]["name"] == sts["spec"]["serviceName"] and governing["spec"].get("clusterIP") == "None",
      "workers.yaml: serviceName is not the headless Service beside it")
worker_args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
check(worker_args[:3] == ["file_sum", "--cluster", "worker"] and "--slots" in worker_args, f"workers.yaml: args {worker_args}")
check(sts["spec"]["replicas"] >= int(env["WEIR_WORKERS"]), "the coordinator waits for more workers than the StatefulSet runs")
check(int(env["WEIR_WORKERS"]) * int(env["WEIR_SLOTS"]) >= int(env["WEIR_PARALLELISM"]),
      "WEIR_WORKERS x WEIR_SLOTS is below WEIR_PARALLELISM: the job never starts")
check(env["WEIR_COORDINATOR"] == f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}",
      "WEIR_COORDINATOR is not the coordinator Service's name and port")

# The coordinator, both ways.
check(deployment["spec"]["replicas"] == 1, "coordinator-deployment.yaml: replicas is not 1")
check(deployment["spec"]["strategy"]["type"] == "Recreate", "coordinator-deployment.yaml: strategy is not Recreate")
check(matches(deployment["spec"]["selector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"]),
      "coordinator-deployment.yaml: the selector does not match the pod labels")
check(job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never"), "coordinator-job.yaml: restartPolicy")
for name in ("job", "deployment"):
    pod = pods[name]
    check(matches(service["spec"]["selector"], pod["metadata"]["labels"]), f"service.yaml does not select the {name}'s pod")
    check(not matches(service["spec"]["selector"], pods["workers"]["metadata"]["labels"]), "service.yaml selects workers")
    c = pod["spec"]["containers"][0]
    check(c["args"][:3] == ["file_sum", "--cluster", "coordinator"], f"{name}: args {c['args'][:3]}")
    check(c["args"][c["args"].index("--listen") + 1] == "0.0.0.0:7700", f"{name}: --listen")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports.get(service["spec"]["ports"][0]["targetPort"]) == service["spec"]["ports"][0]["port"],
          f"service.yaml: targetPort is not the {name}'s coordinator port")
    check(c["livenessProbe"]["tcpSocket"]["port"] in ports, f"{name}: the liveness probe is not on the coordinator port")
    check("terminationGracePeriodSeconds" in pod["spec"], f"{name}: no terminationGracePeriodSeconds")
    check(c["resources"]["requests"] and c["resources"]["limits"], f"{name}: no requests/limits")
# Apart from the role flags, both coordinators run the same job.
check(pods["job"]["spec"]["containers"][0]["args"] == pods["deployment"]["spec"]["containers"][0]["args"],
      "the Job's and the Deployment's coordinator args differ")

if problems:
    sys.exit("\n".join(problems))
print(f"{len(docs)} files, {sum(len(d) for d in docs.values())} objects: ok")
