#!/usr/bin/env python3
"""Checks the Kubernetes manifests: deploy/k8s/ (the default, on object storage) and the
deploy/k8s-rwx/ overlay (a ReadWriteMany volume instead). Every file parses and holds the
kinds it should, and the files agree with each other: names, labels, the ConfigMap's
variables, slots and workers, the object storage settings and credentials, the TLS
mounts, the kustomizations, and the overlay's patches.

    python3 deploy/check_manifests.py        # needs PyYAML (pip install pyyaml)

When `kubectl` is on the PATH it also builds both kustomizations (`kubectl kustomize`,
offline) and checks what they render. Not run by CI; a check to run after editing the
manifests. For schema validation on top, `pip install kubernetes-validate` and run
`kubernetes-validate deploy/k8s/*.yaml` (cert-manager.yaml needs cert-manager's schemas).
"""

import pathlib
import re
import shutil
import subprocess
import sys

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
K8S = DEPLOY / "k8s"
RWX = DEPLOY / "k8s-rwx"

EXPECTED = {
    K8S: {
        "kustomization.yaml": ["Kustomization"],
        "serviceaccount.yaml": ["ServiceAccount"],
        "configmap.yaml": ["ConfigMap"],
        "service.yaml": ["Service"],
        "workers.yaml": ["Service", "StatefulSet"],
        "coordinator-job.yaml": ["Job"],
        "coordinator-deployment.yaml": ["Deployment"],
        "toolbox.yaml": ["Pod"],
        "networkpolicy.yaml": ["NetworkPolicy"],
        "cert-manager.yaml": ["Issuer", "Certificate", "Issuer", "Certificate"],
    },
    RWX: {
        "kustomization.yaml": ["Kustomization"],
        "pvc.yaml": ["PersistentVolumeClaim"],
        "configmap-paths.yaml": ["ConfigMap"],
        "workers-volume.yaml": ["StatefulSet"],
        "coordinator-volume.yaml": ["Job"],
        "toolbox-volume.yaml": ["Pod"],
    },
}
# In deploy/k8s/ but not in its kustomization.yaml: optional extras, and the coordinator
# that is not chosen.
OPTIONAL = {"networkpolicy.yaml", "cert-manager.yaml"}
COORDINATORS = {"coordinator-job.yaml", "coordinator-deployment.yaml"}
# Object storage credentials: in a Secret, never in the ConfigMap.
CREDENTIALS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
JOB_PATHS = ("WEIR_INPUT", "WEIR_OUTPUT", "WEIR_CHECKPOINT_DIR")

problems = []


def check(ok, message):
    if not ok:
        problems.append(message)


def stop_if_problems():
    if problems:
        sys.exit("\n".join(problems))


docs = {}  # (directory, file name) -> objects
for directory, expected in EXPECTED.items():
    for path in sorted(directory.glob("*.yaml")):
        try:
            loaded = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            problems.append(f"{directory.name}/{path.name}: does not parse: {e}")
            continue
        docs[directory, path.name] = loaded
        kinds = [d.get("kind") for d in loaded]
        check(kinds == expected.get(path.name),
              f"{directory.name}/{path.name}: kinds {kinds}, expected {expected.get(path.name)}")
        for d in loaded:
            check("namespace" not in d.get("metadata", {}), f"{directory.name}/{path.name}: names a namespace")
            if d.get("kind") != "Kustomization":
                check(d.get("apiVersion") and d.get("metadata", {}).get("name"),
                      f"{directory.name}/{path.name}: no apiVersion or name")
    present = {f for (dd, f) in docs if dd == directory}
    check(present == set(expected), f"{directory.name}/: files {sorted(present)}, expected {sorted(expected)}")
stop_if_problems()


def one(file, kind, directory=K8S):
    return next(d for d in docs[directory, file] if d["kind"] == kind)


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def pod_spec(obj):
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def pod_labels(obj):
    return obj["metadata"]["labels"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"]["labels"]


config = one("configmap.yaml", "ConfigMap")
env = config["data"]
check(all(isinstance(v, str) for v in env.values()), "configmap.yaml: every value must be a string")
service = one("service.yaml", "Service")
check(service["spec"].get("type", "ClusterIP") == "ClusterIP", "service.yaml: not ClusterIP")
account = one("serviceaccount.yaml", "ServiceAccount")
check(account.get("automountServiceAccountToken") is False,
      "serviceaccount.yaml: weir needs no Kubernetes API token (automountServiceAccountToken: false)")
sts = one("workers.yaml", "StatefulSet")
job = one("coordinator-job.yaml", "Job")
deployment = one("coordinator-deployment.yaml", "Deployment")
toolbox = one("toolbox.yaml", "Pod")
# Every object that runs weir, by the file that holds it.
pods = {"workers.yaml": sts, "coordinator-job.yaml": job, "coordinator-deployment.yaml": deployment,
        "toolbox.yaml": toolbox}

# --- Object storage: the job's URLs, the settings, and no credentials in the ConfigMap.
buckets = set()
for p in JOB_PATHS:
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(\S+)", env.get(p, ""))
    check(m, f"configmap.yaml: {p} is {env.get(p)!r}, not an s3://bucket/key URL")
    if m:
        buckets.add(m.group(1))
check(len(buckets) <= 1, f"configmap.yaml: {', '.join(JOB_PATHS)} name different buckets {sorted(buckets)}")
check(len({env.get(p) for p in JOB_PATHS}) == len(JOB_PATHS), "configmap.yaml: the job's URLs must differ")
check(not CREDENTIALS & set(env), f"configmap.yaml: holds credentials {sorted(CREDENTIALS & set(env))}; "
      "they belong in the Secret weir-object-storage")
check(env.get("AWS_REGION"), "configmap.yaml: no AWS_REGION")
for key in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"):
    check(env.get(key, "unset") != "", f"configmap.yaml: {key} is empty; comment it out instead")

# --- TLS: one optional Secret, mounted read-only at one path, named by WEIR_TLS_DIR.
certificate = next(d for d in docs[K8S, "cert-manager.yaml"] if d["kind"] == "Certificate"
                   and d["spec"]["secretName"] != d["spec"]["issuerRef"]["name"] and not d["spec"].get("isCA"))
tls_secret = certificate["spec"]["secretName"]
tls_paths = set()

# --- Every weir pod.
for name, obj in pods.items():
    spec = pod_spec(obj)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    check(not any("persistentVolumeClaim" in v for v in volumes.values()),
          f"{name}: mounts a PersistentVolumeClaim; the default pods share no volume (see k8s-rwx/)")
    check(spec.get("serviceAccountName") == account["metadata"]["name"],
          f"{name}: serviceAccountName is not {account['metadata']['name']}")
    tls_volumes = [n for n, v in volumes.items() if v.get("secret", {}).get("secretName") == tls_secret]
    check(len(tls_volumes) == 1, f"{name}: no single volume of the Secret {tls_secret}")
    for n in tls_volumes:
        check(volumes[n]["secret"].get("optional") is True,
              f"{name}: the Secret {tls_secret} must be optional, so pods start without TLS")
    for c in spec["containers"]:
        check(c["image"] == "weir-file-sum:latest", f"{name}: image {c['image']}")
        check("command" not in c, f"{name}: `command` would bypass tini; use args")
        refs = [e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e]
        check(refs == [config["metadata"]["name"]], f"{name}: envFrom configMapRefs {refs}")
        secrets = [e["secretRef"] for e in c.get("envFrom", []) if "secretRef" in e]
        check([s["name"] for s in secrets] == ["weir-object-storage"],
              f"{name}: {c['name']} does not load the Secret weir-object-storage with envFrom")
        check(all(s.get("optional") is True for s in secrets),
              f"{name}: weir-object-storage must be optional (IAM roles and workload identity need no Secret)")
        check(not CREDENTIALS & {e["name"] for e in c.get("env", [])}, f"{name}: credentials in env")
        for arg in c.get("args", []):
            for var in re.findall(r"\$\((\w+)\)", arg):
                check(var in env, f"{name}: args use $({var}), which configmap.yaml lacks")
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        for m in mounts.values():
            check(m["name"] in volumes, f"{name}: mounts volume {m['name']}, which the pod lacks")
        check(not any(p == "/data" or p.startswith("/data/") for p in mounts), f"{name}: mounts /data")
        tls_mounts = [m for m in mounts.values() if m["name"] in tls_volumes]
        check(len(tls_mounts) == 1 and tls_mounts[0].get("readOnly") is True,
              f"{name}: {c['name']} does not mount {tls_secret} once, read-only")
        tls_paths.update(m["mountPath"] for m in tls_mounts)
        if c.get("securityContext", {}).get("readOnlyRootFilesystem"):
            check("/tmp" in mounts, f"{name}: read-only root without a writable /tmp")
    mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
    check(set(volumes) <= mounted, f"{name}: volumes {sorted(set(volumes) - mounted)} are not mounted")
check(len(tls_paths) == 1, f"the Secret {tls_secret} is mounted at different paths {sorted(tls_paths)}")
check(env.get("WEIR_TLS_DIR") in ("", *tls_paths),
      f"configmap.yaml: WEIR_TLS_DIR is {env.get('WEIR_TLS_DIR')!r}: empty (no TLS) or where {tls_secret} "
      f"is mounted ({', '.join(sorted(tls_paths))})")
# The certificate: valid for the name clients give `weir cluster --web`, for both ends.
check(service["metadata"]["name"] in certificate["spec"].get("dnsNames", []),
      f"cert-manager.yaml: {tls_secret} is not valid for the Service name {service['metadata']['name']}")
check({"server auth", "client auth"} <= set(certificate["spec"].get("usages", [])),
      "cert-manager.yaml: the certificate must allow server auth and client auth (mutual TLS)")
ca_issuer = next((d for d in docs[K8S, "cert-manager.yaml"] if d["kind"] == "Issuer"
                  and d["metadata"]["name"] == certificate["spec"]["issuerRef"]["name"]), None)
check(ca_issuer and "ca" in ca_issuer["spec"], "cert-manager.yaml: the certificate's issuer is not a CA Issuer")

# --- The workers.
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

# --- The coordinator, both ways.
check(deployment["spec"]["replicas"] == 1, "coordinator-deployment.yaml: replicas is not 1")
check(deployment["spec"]["strategy"]["type"] == "Recreate", "coordinator-deployment.yaml: strategy is not Recreate")
check(matches(deployment["spec"]["selector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"]),
      "coordinator-deployment.yaml: the selector does not match the pod labels")
check(job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never"), "coordinator-job.yaml: restartPolicy")
for name in ("coordinator-job.yaml", "coordinator-deployment.yaml"):
    pod = pods[name]["spec"]["template"]
    check(matches(service["spec"]["selector"], pod["metadata"]["labels"]), f"service.yaml does not select the pod of {name}")
    check(not matches(service["spec"]["selector"], pod_labels(sts)), "service.yaml selects workers")
    c = pod["spec"]["containers"][0]
    check(c["args"][:3] == ["file_sum", "--cluster", "coordinator"], f"{name}: args {c['args'][:3]}")
    check(c["args"][c["args"].index("--listen") + 1] == "0.0.0.0:7700", f"{name}: --listen")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports.get(service["spec"]["ports"][0]["targetPort"]) == service["spec"]["ports"][0]["port"],
          f"service.yaml: targetPort is not the coordinator port of {name}")
    check(c["livenessProbe"]["tcpSocket"]["port"] in ports, f"{name}: the liveness probe is not on the coordinator port")
    check("terminationGracePeriodSeconds" in pod["spec"], f"{name}: no terminationGracePeriodSeconds")
    check(c["resources"]["requests"] and c["resources"]["limits"], f"{name}: no requests/limits")
# Apart from the role flags, both coordinators run the same job.
check(job["spec"]["template"]["spec"]["containers"][0]["args"] == deployment["spec"]["template"]["spec"]["containers"][0]["args"],
      "the Job's and the Deployment's coordinator args differ")

# --- deploy/k8s/kustomization.yaml: everything but the extras, and exactly one coordinator.
kustomization = one("kustomization.yaml", "Kustomization")
resources = kustomization.get("resources", [])
check(len(resources) == len(set(resources)), "k8s/kustomization.yaml: a resource is listed twice")
for r in resources:
    check((K8S / r).is_file(), f"k8s/kustomization.yaml: lists {r}, which does not exist")
chosen = COORDINATORS & set(resources)
check(len(chosen) == 1, f"k8s/kustomization.yaml: lists coordinators {sorted(chosen)}; list exactly one")
check(set(resources) == set(EXPECTED[K8S]) - OPTIONAL - {"kustomization.yaml"} - (COORDINATORS - chosen),
      f"k8s/kustomization.yaml: resources {resources}")
base = [d for r in resources for d in docs.get((K8S, r), [])]

# --- deploy/k8s-rwx/: the PVC, and patches that name base objects, containers and paths.
overlay = one("kustomization.yaml", "Kustomization", RWX)
check(sorted(overlay.get("resources", [])) == ["../k8s", "pvc.yaml"],
      f"k8s-rwx/kustomization.yaml: resources {overlay.get('resources')}, expected ../k8s and pvc.yaml")
pvc = one("pvc.yaml", "PersistentVolumeClaim", RWX)
check(pvc["spec"]["accessModes"] == ["ReadWriteMany"], "k8s-rwx/pvc.yaml: the volume must be ReadWriteMany")
patch_files = [p.get("path") or "an inline patch (keep patches in files, to be checked)" for p in overlay.get("patches", [])]
check(sorted(patch_files) == sorted(set(EXPECTED[RWX]) - {"kustomization.yaml", "pvc.yaml"}),
      f"k8s-rwx/kustomization.yaml: patches {patch_files}")
patched = set()  # base objects (kind, name) the overlay patches
for entry in overlay.get("patches", []):
    file = entry.get("path")
    if file is None:
        continue  # named above
    if (RWX, file) not in docs:
        problems.append(f"k8s-rwx/kustomization.yaml: patch {file} does not exist")
        continue
    patch = docs[RWX, file][0]
    target = entry.get("target")
    if target:
        kinds = re.compile(target.get("kind", ".*"))
        selector = dict(s.split("=", 1) for s in target.get("labelSelector", "").split(",") if s)
        targets = [d for d in base if kinds.fullmatch(d["kind"]) and matches(selector, d["metadata"].get("labels", {}))
                   and (target.get("name") in (None, d["metadata"]["name"]))]
        # The patch must fit either coordinator, whichever the base lists.
        alternatives = [pods[f] for f in sorted(COORDINATORS)] if any(
            t["kind"] in ("Job", "Deployment") for t in targets) else []
    else:
        targets = [d for d in base if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"]]
        alternatives = []
    check(len(targets) == 1, f"k8s-rwx/{file}: patches {len(targets)} objects of the base, expected 1")
    for t in targets:
        patched.add((t["kind"], t["metadata"]["name"]))
    for t in targets + [a for a in alternatives if a not in targets]:
        where = f"k8s-rwx/{file} on {t['kind']} {t['metadata']['name']}"
        if t["kind"] == "ConfigMap":
            check(set(patch["data"]) == set(JOB_PATHS), f"{where}: sets {sorted(patch['data'])}, expected {JOB_PATHS}")
            check(all(v.startswith("/data/") for v in patch["data"].values()), f"{where}: paths not under /data")
            continue
        spec, pspec = pod_spec(t), pod_spec(patch)
        containers = {c["name"] for c in spec["containers"]}
        names = {c["name"] for c in pspec.get("containers", [])}
        check(names and names <= containers, f"{where}: containers {sorted(names)}, the pod has {sorted(containers)}")
        pvolumes = {v["name"]: v for v in pspec.get("volumes", [])}
        check([v.get("persistentVolumeClaim", {}).get("claimName") for v in pvolumes.values()] == [pvc["metadata"]["name"]],
              f"{where}: does not add the volume of the claim {pvc['metadata']['name']}")
        check(not set(pvolumes) & {v["name"] for v in spec.get("volumes", [])},
              f"{where}: adds a volume name the pod already has")
        for c in pspec.get("containers", []):
            ms = c.get("volumeMounts", [])
            check([(m["name"], m["mountPath"]) for m in ms] == [(n, "/data") for n in pvolumes],
                  f"{where}: {c['name']} does not mount the claim at /data")
# Every base object that runs weir gets the volume, and the ConfigMap its paths.
for obj in [config] + [o for f, o in pods.items() if f in resources]:
    check((obj["kind"], obj["metadata"]["name"]) in patched,
          f"k8s-rwx/: nothing patches {obj['kind']} {obj['metadata']['name']} of the base")
stop_if_problems()

# --- What kustomize renders, when kubectl is here to build it (offline).
rendered = 0
if shutil.which("kubectl"):
    for directory in (K8S, RWX):
        out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True)
        if out.returncode != 0:
            problems.append(f"kubectl kustomize {directory.name}: {out.stderr.strip()}")
            continue
        objects = [d for d in yaml.safe_load_all(out.stdout) if d]
        rendered += 1
        runs = [o for o in objects if o["kind"] in ("StatefulSet", "Job", "Deployment", "Pod")]
        check(sum(o["kind"] in ("Job", "Deployment") for o in runs) == 1,
              f"kubectl kustomize {directory.name}: not exactly one coordinator")
        data = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
        for o in runs:
            spec = pod_spec(o)
            claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
            mounts = [m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])]
            if directory == K8S:
                check(not claims and "/data" not in mounts, f"kubectl kustomize k8s: {o['metadata']['name']} mounts a volume")
            else:
                check(claims == [pvc["metadata"]["name"]] and "/data" in mounts,
                      f"kubectl kustomize k8s-rwx: {o['metadata']['name']} lacks the volume at /data")
        for p in JOB_PATHS:
            check(data[p].startswith("s3://" if directory == K8S else "/data/"),
                  f"kubectl kustomize {directory.name}: {p} is {data[p]}")
        check(any(o["kind"] == "PersistentVolumeClaim" for o in objects) == (directory == RWX),
              f"kubectl kustomize {directory.name}: the PVC is {'missing' if directory == RWX else 'there'}")

stop_if_problems()
files = sum(1 for _ in docs)
note = "; both kustomizations built" if rendered == 2 else "; kubectl not found, kustomizations not built"
print(f"{files} files, {sum(len(d) for d in docs.values())} objects: ok{note}")
