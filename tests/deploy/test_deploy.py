"""The deployment files parse, name only what the repository builds, and start a valid proxy."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SA = "/var/run/secrets/kubernetes.io/serviceaccount"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def dockerfile_argv() -> list[str]:
    entry, cmd = [], []
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            entry = yaml.safe_load(line.removeprefix("ENTRYPOINT "))
        if line.startswith("CMD "):
            cmd = yaml.safe_load(line.removeprefix("CMD "))
    return entry + cmd


def run_check(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a deployed command line with ``--check``, its absolute paths moved under tmp_path."""
    policy = tmp_path / "etc" / "ctrlrun.yaml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    configmap = documents(DEPLOY / "kubernetes" / "configmap.yaml")[0]
    sa = tmp_path / "sa"
    sa.mkdir(exist_ok=True)
    (sa / "ca.crt").write_text(_any_ca())
    (sa / "token").write_text("token")
    policy.write_text(configmap["data"]["ctrlrun.yaml"].replace(SA, str(sa)))
    mapped = []
    for arg in argv:
        arg = arg.replace("/etc/ctrlrun/ctrlrun.yaml", str(policy))
        for prefix in ("/var/lib/ctrlrun", "/ca"):
            if arg == prefix or arg.startswith(prefix + "/"):
                arg = str(tmp_path / arg.lstrip("/"))
        mapped.append(arg)
    assert mapped[:2] == ["ctrlrun", "proxy"], mapped
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "CTRLRUN_STORE_URL": f"sqlite:///{tmp_path / 'state.db'}",
    }
    return subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", *mapped[1:], "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _any_ca() -> str:
    import certifi

    return Path(certifi.where()).read_text()


def test_dockerfile_command_passes_check(tmp_path: Path) -> None:
    argv = dockerfile_argv()
    assert argv[:2] == ["ctrlrun", "proxy"]
    result = run_check(argv, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok:")


def test_dockerfile_builds_only_repository_sources() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src
    assert "USER 10001" in text and "HEALTHCHECK" in text
    assert "'.[proxy,postgres]'" in text


def kube_objects() -> dict[str, dict]:
    objs = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in documents(path):
            objs[f"{doc['kind']}/{doc.get('metadata', {}).get('name', path.stem)}"] = doc
    return objs


def test_kustomization_lists_every_manifest() -> None:
    kust = documents(DEPLOY / "kubernetes" / "kustomization.yaml")[0]
    files = {p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    assert [i["name"] for i in kust["images"]] == ["ctrlrun"]


def test_sidecar_manifest_wires_proxy_ca_policy_store_and_probes() -> None:
    objs = kube_objects()
    pod = objs["Deployment/refund-agent"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    agent, sidecar = containers["agent"], containers["ctrlrun"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:8080"
    assert env["SSL_CERT_FILE"].startswith("/ca/")
    assert sidecar["image"] == "ctrlrun"
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert sidecar["resources"]["limits"] and agent["resources"]["limits"]
    store = next(e for e in sidecar["env"] if e["name"] == "CTRLRUN_STORE_URL")
    assert store["valueFrom"]["secretKeyRef"]["name"] in {
        k.split("/")[1] for k in objs if k.startswith("Secret/")
    }
    assert "ConfigMap/ctrlrun-policy" in objs and "NetworkPolicy/refund-agent-egress" in objs


@pytest.mark.parametrize("container", ["ctrlrun", "ctrlrun-ca"])
def test_manifest_command_lines_pass_check(container: str, tmp_path: Path) -> None:
    pod = kube_objects()["Deployment/refund-agent"]["spec"]["template"]["spec"]
    spec = {c["name"]: c for c in pod["containers"] + pod["initContainers"]}[container]
    argv = spec.get("command") or [*dockerfile_argv()[:2], *spec["args"]]
    argv = [a for a in argv if a != "--check"]
    result = run_check(argv, tmp_path)
    assert result.returncode == 0, result.stderr


def test_compose_file_parses_and_builds_the_dockerfile() -> None:
    compose = documents(DEPLOY / "compose.yaml")[0]
    build = compose["services"]["ctrlrun"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert (DEPLOY / "policy.yaml").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (DEPLOY / "systemd" / "ctrlrun-proxy.service").read_text()
    ctrlrun = shutil.which("ctrlrun") or str(Path(sys.executable).with_name("ctrlrun"))
    unit = unit.replace("/usr/local/bin/ctrlrun", ctrlrun)
    path = tmp_path / "ctrlrun-proxy.service"
    path.write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    errors = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "ctrlrun-proxy.service" in line and "Failed" in line
    ]
    assert not errors, result.stderr
    for arg in shlex.split(unit.split("ExecStart=")[1].splitlines()[0])[1:3]:
        assert arg in ("proxy", "--policy")


def pod_spec() -> dict:
    return kube_objects()["Deployment/refund-agent"]["spec"]["template"]["spec"]


def test_only_the_sidecar_may_leave_the_pod() -> None:
    """The egress init container names the sidecar's UID, the agent runs under another."""
    pod = pod_spec()
    containers = {c["name"]: c for c in pod["containers"]}
    agent, sidecar = containers["agent"], containers["ctrlrun"]
    egress = next(c for c in pod["initContainers"] if c["name"] == "ctrlrun-egress")
    settings = {e["name"]: e["value"] for e in egress["env"]}
    sidecar_uid = sidecar["securityContext"]["runAsUser"]
    assert settings["CTRLRUN_UID"] == str(sidecar_uid)
    assert agent["securityContext"]["runAsUser"] not in (sidecar_uid, 0)
    assert egress["command"] == ["ctrlrun-egress"] and egress["image"] == "ctrlrun"
    caps = egress["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"] and set(caps["add"]) <= {"NET_ADMIN", "NET_RAW"}
    # The agent cannot undo the rules or become the sidecar's UID.
    for c in (agent, sidecar):
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # The egress step must run before any container: it is an init container, after the CA.
    assert [c["name"] for c in pod["initContainers"]][-1] == "ctrlrun-egress"
    listen = sidecar["args"][sidecar["args"].index("--listen") + 1]
    assert listen == f"127.0.0.1:{settings['CTRLRUN_PORT']}"
    env = {e["name"]: e.get("value") for e in agent["env"]}
    if settings["CTRLRUN_MODE"] == "transparent":
        assert sidecar["args"][sidecar["args"].index("--mode") + 1] == "transparent"
        assert not any(name.lower().endswith("_proxy") for name in env)
    else:
        assert settings["CTRLRUN_MODE"] == "owner" and "--mode" not in sidecar["args"]
        assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == f"http://{listen}"


def test_only_the_sidecar_holds_the_service_account_token() -> None:
    pod = pod_spec()
    assert pod["automountServiceAccountToken"] is False
    mounts = {
        c["name"]: {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        for c in pod["containers"] + pod["initContainers"]
    }
    assert mounts["ctrlrun"][SA] == "kube-api-access"
    assert all(SA not in paths for name, paths in mounts.items() if name != "ctrlrun")
    volume = next(v for v in pod["volumes"] if v["name"] == "kube-api-access")
    sources = volume["projected"]["sources"]
    assert {"path": "token", "expirationSeconds": 3607} in [
        s.get("serviceAccountToken") for s in sources
    ]
    policy = documents(DEPLOY / "kubernetes" / "configmap.yaml")[0]["data"]["ctrlrun.yaml"]
    assert f"token_file: {SA}/token" in policy and f"ca_file: {SA}/ca.crt" in policy


def test_every_shipped_sidecar_names_its_agent() -> None:
    """Without --principal (or agents: in the policy) every protected write is refused."""
    pod = pod_spec()
    commands = [c.get("command", []) + c.get("args", []) for c in pod["containers"][1:]]
    commands += [pod["initContainers"][0]["command"]]
    compose = documents(DEPLOY / "compose.yaml")[0]
    commands.append(compose["services"]["ctrlrun"]["command"])
    unit = (DEPLOY / "systemd" / "ctrlrun-proxy.service").read_text()
    commands += [
        shlex.split(line.split("=", 1)[1])
        for line in unit.splitlines()
        if line.startswith("ExecStart") and " proxy " in line
    ]
    assert len(commands) == 5
    for argv in commands:
        assert "--principal" in argv, argv


def test_the_image_ships_the_egress_script() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "COPY deploy/ctrlrun-egress.sh /usr/local/bin/ctrlrun-egress" in text
    assert "install -y --no-install-recommends iptables" in text
    syntax = subprocess.run(
        ["sh", "-n", str(DEPLOY / "ctrlrun-egress.sh")], capture_output=True, text=True
    )
    assert syntax.returncode == 0, syntax.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "CTRLRUN_UID must be"),
        ({"CTRLRUN_UID": "ctrlrun"}, "CTRLRUN_UID must be"),
        ({"CTRLRUN_UID": "10001", "CTRLRUN_MODE": "open"}, "must be owner or transparent"),
        ({"CTRLRUN_UID": "10001", "CTRLRUN_PORT": "80a"}, "CTRLRUN_PORT must be"),
    ],
)
def test_the_egress_script_refuses_bad_settings_before_touching_anything(
    env: dict[str, str], message: str
) -> None:
    result = subprocess.run(
        [shutil.which("sh") or "/bin/sh", str(DEPLOY / "ctrlrun-egress.sh")],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent", **env},  # no iptables to call, even by mistake
        timeout=30,
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_the_init_containers_check_creates_the_ca_the_agent_trusts(tmp_path: Path) -> None:
    pod = pod_spec()
    argv = [a for a in pod["initContainers"][0]["command"] if a != "--check"]
    result = run_check(argv, tmp_path)
    assert result.returncode == 0, result.stderr
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    ca = next(e["value"] for e in agent["env"] if e["name"] == "SSL_CERT_FILE")
    assert (tmp_path / ca.lstrip("/")).read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert f"CA {tmp_path / ca.lstrip('/')}" in result.stdout


def test_compose_keeps_the_agent_on_an_internal_network() -> None:
    compose = documents(DEPLOY / "compose.yaml")[0]
    services, networks = compose["services"], compose["networks"]
    assert services["agent"]["networks"] == ["agents"] and networks["agents"]["internal"] is True
    assert "agents" in services["ctrlrun"]["networks"]
    assert services["agent"]["environment"]["HTTPS_PROXY"] == "http://ctrlrun:8080"
    assert services["agent"]["profiles"] == ["agent"]  # `up` without it starts the sidecar alone


def test_systemd_agent_drop_in_allows_only_loopback() -> None:
    text = (DEPLOY / "systemd" / "ctrlrun-agent.conf").read_text()
    lines = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in text.splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert lines["IPAddressDeny"] == "any" and lines["IPAddressAllow"] == "localhost"
    assert "HTTPS_PROXY=http://127.0.0.1:8080" in text
    assert (
        "ExecStartPre=/usr/bin/install -m 0644"
        in (DEPLOY / "systemd" / "ctrlrun-proxy.service").read_text()
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_agent_drop_in_verifies(tmp_path: Path) -> None:
    """The drop-in's directives are valid in an agent's unit (here a stand-in one)."""
    drop_in = (DEPLOY / "systemd" / "ctrlrun-agent.conf").read_text()
    unit = tmp_path / "refund-agent.service"
    unit.write_text(f"[Service]\nExecStart=/bin/true\n\n{drop_in}")
    sidecar = tmp_path / "ctrlrun-proxy.service"  # the unit the drop-in requires
    ctrlrun = shutil.which("ctrlrun") or str(Path(sys.executable).with_name("ctrlrun"))
    text = (DEPLOY / "systemd" / "ctrlrun-proxy.service").read_text()
    sidecar.write_text(text.replace("/usr/local/bin/ctrlrun", ctrlrun))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit), str(sidecar)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    problems = [
        line
        for line in output.splitlines()
        if "refund-agent.service" in line and ("Unknown" in line or "Failed" in line)
    ]
    assert not problems, output


@pytest.mark.parametrize("where", ["configmap", "policy"])
def test_shipped_policies_deny_egress_beyond_the_listed_hosts(where: str) -> None:
    """The pod's only way out is the sidecar; the sidecar's way out is the egress list."""
    if where == "configmap":
        text = documents(DEPLOY / "kubernetes" / "configmap.yaml")[0]["data"]["ctrlrun.yaml"]
    else:
        text = (DEPLOY / "policy.yaml").read_text()
    egress = yaml.safe_load(text)["egress"]
    assert egress["default"] == "deny" and "api.openai.com" in egress["allow"]
