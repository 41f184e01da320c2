"""deploy/ checked without a cluster or an image registry: every Kubernetes manifest validates (kubernetes-validate
ships the schemas), the flags in the manifests and the compose file are the CLI's, the grace periods outlast the
drain, HAProxy accepts both configurations, and the Dockerfile installs what `make serve` installs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from realtime.cli import parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kind(name: str) -> list[dict]:
    return [d for p in MANIFESTS for d in docs(p) if d["kind"] == name]


def serve_args(args: list[str]):
    return parser().parse_args(["serve", *args])  # exits (SystemExit) on a flag the CLI does not have


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_against_the_kubernetes_schemas(path):
    resources = docs(path)
    assert resources
    for resource in resources:
        kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)


def test_a_misspelt_field_fails_validation():
    deployment = kind("Deployment")[0]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_the_replica_pods_probe_readiness_outlast_the_drain_and_are_covered_by_the_budget():
    deployment = next(d for d in kind("Deployment") if d["metadata"]["name"] == "omni-realtime")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = serve_args(container["args"])
    assert pod["terminationGracePeriodSeconds"] > args.drain_seconds + args.drain_notice_seconds + 5
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    readiness = container["readinessProbe"]
    assert args.drain_notice_seconds >= readiness["periodSeconds"] * readiness["failureThreshold"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert kind("PodDisruptionBudget")[0]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert kind("HorizontalPodAutoscaler")[0]["spec"]["metrics"][0]["pods"]["metric"]["name"] == "omni_sessions_open"
    proxy_cfg = kind("ConfigMap")[0]["data"]["haproxy.cfg"]
    assert f"maxconn {args.max_sessions} " in proxy_cfg and args.max_sessions_per_client == args.max_sessions


def test_the_compose_replicas_use_real_flags_and_the_proxy_lists_each_of_them():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    replicas = {name: s for name, s in compose["services"].items() if name != "proxy"}
    assert len(replicas) >= 2
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    for name, service in replicas.items():
        args = serve_args(service["command"])
        assert int(service["stop_grace_period"].rstrip("s")) > args.drain_seconds + args.drain_notice_seconds
        assert re.search(rf"^    server \S+ {name}:8000$", haproxy, re.M), name
        assert f"maxconn {args.max_sessions} " in haproxy and args.max_sessions_per_client == args.max_sessions
        inter, fall = re.search(r"inter (\d+)s fall (\d+)", haproxy).groups()
        assert args.drain_notice_seconds >= int(inter) * int(fall)
    gpus = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in replicas.values()]
    assert len({g[0] for g in gpus}) == len(gpus)  # one replica per GPU


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (.ci/run does)")
@pytest.mark.parametrize("which", ["haproxy.cfg", "k8s/proxy.yaml"])
def test_haproxy_accepts_the_configuration(which, tmp_path):
    text = (DEPLOY / which).read_text() if which.endswith(".cfg") else kind("ConfigMap")[0]["data"]["haproxy.cfg"]
    (tmp_path / "haproxy.cfg").write_text(text)
    checked = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def makefile_runtime_target() -> tuple[str, list[str]]:
    """The file target that `make serve` depends on, and its recipe."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) :?= (.*)$", text, re.M))
    serve_deps = re.search(r"^serve: (.*)$", text, re.M).group(1).split()
    assert serve_deps == ["$(RUNTIME)"]
    target = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], variables["RUNTIME"])
    recipe = re.search(r"^\$\(RUNTIME\):.*\n((?:\t.*\n)+)", text, re.M).group(1)
    return target, recipe.split("\n")


def test_the_dockerfile_installs_what_make_serve_installs():
    target, recipe = makefile_runtime_target()
    assert any("pip install -q $(TORCH)" in line for line in recipe) and any("pip install -q -e ." in line
                                                                            for line in recipe)
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    runs = re.findall(r"^RUN ((?:.*\\\n)*.*)", dockerfile, re.M)
    installs = [r for r in runs if r.split()[0] == "make"]
    assert installs == [f'make {target} TORCH="$TORCH"' + " && chown -R omni /app"], installs
    assert not any("pip" in r for r in runs)  # nothing installed besides the Makefile's own steps
    torch_default = re.search(r"^TORCH \?= (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert f"ARG TORCH={torch_default}" in dockerfile
    assert re.search(r"^FROM nvidia/cuda:[\d.]+-(cudnn-)?runtime-", dockerfile, re.M)
    packages = re.search(r'include = \[(.*)\]', (ROOT / "pyproject.toml").read_text()).group(1)
    for package in re.findall(r'"(\w+)\*"', packages):  # the editable install needs every package's source
        assert f"COPY {package} {package}" in dockerfile, package
    entry = re.search(r"^ENTRYPOINT (.*)$", dockerfile, re.M).group(1)
    assert entry.startswith('["omni-realtime", "serve"')  # exec form: the server is PID 1 and gets SIGTERM
