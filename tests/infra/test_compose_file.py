"""docker-compose.yml, .env.example and deploy/: valid for Docker Compose, and wired to warren's real settings.

``docker-compose config`` (Debian's docker-compose 1.29, which needs no Docker engine for
``config``) validates the file; the other tests read it with tests/compose.py, whose
reading is checked against docker-compose's here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from messaging import Settings
from tests.compose import (
    CLUSTER_FILE,
    COMPOSE_FILE,
    ENV_EXAMPLE,
    ROOT,
    duration_s,
    interpolate,
    load_compose,
    named_mounts,
    read_env_file,
    service_command,
    service_environment,
)
from worker.cli import build_parser
from worker.config import CollectorConfig, role_config
from worker.job import JobConfig

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
WARREN_SERVICES = ("collector", "coordinator", "learner")
DOCS = ROOT / "docs" / "compose.md"
#: Settings the compose file deliberately does not pass through (documented in docs/compose.md).
NOT_IN_COMPOSE = {"WARREN_AMQP_CA_FILE", "WARREN_WORKER_ID"}
#: Settings the compose file fixes instead of reading .env: Prometheus' scrape config names the port.
FIXED_IN_COMPOSE = {"WARREN_METRICS_PORT": "9464", "WARREN_METRICS_ADDR": "0.0.0.0"}
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
PROMETHEUS_CLUSTER_CONFIG = ROOT / "deploy" / "prometheus-cluster.yml"

EXAMPLE = read_env_file()


def settings_variables() -> set[str]:
    return {"WARREN_" + f.name.upper() for f in dataclasses.fields(Settings)}


def collector_variables() -> set[str]:
    names = {f.name for f in dataclasses.fields(CollectorConfig)} - {"transport"}
    return {"WARREN_" + name.upper() for name in names}


def compose_variables() -> set[str]:
    """Every variable docker-compose.yml and its cluster override interpolate."""
    text = COMPOSE_FILE.read_text() + CLUSTER_FILE.read_text()
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def compose_defaults() -> dict[str, str]:
    """``{VAR: default}`` of every ``${VAR:-default}`` in docker-compose.yml and its cluster override."""
    found: dict[str, str] = {}
    for path in (COMPOSE_FILE, CLUSTER_FILE):
        for variable, default in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}", path.read_text()):
            assert found.setdefault(variable, default) == default, f"{variable}: two defaults"
    return found


def arg_after(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


# -- docker-compose itself -------------------------------------------------------------


def run_docker_compose_config(env_file: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        if CI:
            pytest.fail("docker-compose is not installed (scripts/test installs Debian's package)")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    # A clean environment: variables of the calling shell would override the env file.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    chosen = [arg for path in files or (COMPOSE_FILE,) for arg in ("-f", str(path))]
    return subprocess.run(
        [exe, "--project-directory", str(ROOT), "--env-file", str(env_file), *chosen, "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def docker_compose_config(env_file: Path, *files: Path) -> dict[str, Any]:
    """``docker-compose config`` of ``files`` (default: docker-compose.yml alone), as read back."""
    done = run_docker_compose_config(env_file, *files)
    assert done.returncode == 0, f"docker-compose config failed:\n{done.stderr}"
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


@pytest.mark.parametrize("env_name", ["env.example", "no .env"])
def test_docker_compose_accepts_the_file_and_reads_it_as_we_do(env_name: str, tmp_path: Path) -> None:
    if env_name == "env.example":
        env_file, variables = ENV_EXAMPLE, EXAMPLE
    else:
        env_file, variables = tmp_path / "empty.env", {}
        env_file.write_text("")
    rendered = docker_compose_config(env_file)
    ours = load_compose(variables)
    assert set(rendered["services"]) == set(ours["services"]) == {"rabbitmq", "prometheus", *WARREN_SERVICES}
    assert set(rendered["volumes"]) == {"rabbitmq-data", "warren-data", "prometheus-data"}
    for name, service in rendered["services"].items():
        assert service_environment(service) == service_environment(ours["services"][name]), name
        if name in WARREN_SERVICES:
            assert service_command(service) == service_command(ours["services"][name]), name
    health = rendered["services"]["rabbitmq"]["healthcheck"]
    assert "rabbitmq-diagnostics" in health["test"]
    assert duration_s(health["start_period"]) > 0
    collector = rendered["services"]["collector"]
    assert "container_name" not in collector
    assert "ports" not in collector
    # `scale`, not deploy.replicas: docker-compose 1.x ignores deploy.replicas without --compatibility.
    assert collector["scale"] == int(variables.get("WARREN_COLLECTORS", "2"))
    assert "deploy" not in collector
    for name in WARREN_SERVICES:
        assert rendered["services"][name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name
    rabbit_env = rendered["services"]["rabbitmq"]["environment"]
    assert rabbit_env["RABBITMQ_DEFAULT_USER"] != "guest"
    assert rabbit_env["RABBITMQ_DEFAULT_PASS"] not in ("guest", "")
    assert "guest" not in collector["environment"]["WARREN_AMQP_URL"]


# -- the broker service -------------------------------------------------------------------


@pytest.mark.parametrize("variables", [EXAMPLE, {}], ids=["env.example", "defaults"])
def test_broker_credentials_are_not_guest_and_match_the_workers_url(variables: dict[str, str]) -> None:
    services = load_compose(variables)["services"]
    rabbit_env = service_environment(services["rabbitmq"])
    user, password = rabbit_env["RABBITMQ_DEFAULT_USER"], rabbit_env["RABBITMQ_DEFAULT_PASS"]
    assert user and password
    assert "guest" not in (user, password)
    for name in WARREN_SERVICES:
        url = urlsplit(service_environment(services[name])["WARREN_AMQP_URL"])
        assert (url.scheme, url.hostname, url.port) == ("amqp", "rabbitmq", 5672), name
        assert (url.username, url.password) == (user, password), name
        assert unquote(url.path) == "//", name  # the default vhost "/"


def test_broker_is_monitorable_persistent_and_configured() -> None:
    compose = load_compose(EXAMPLE)
    rabbit = compose["services"]["rabbitmq"]
    assert re.fullmatch(r"rabbitmq:(3\.1[3-9]|[4-9]\.\d+)(\.\d+)?-management", rabbit["image"])
    assert rabbit["hostname"] == "rabbitmq"  # the node name, hence the data directory, stays fixed
    published = {int(str(port).rsplit(":", 1)[1]): str(port) for port in rabbit["ports"]}
    assert set(published) == {5672, 15672, 15692}
    assert all(spec.startswith("127.0.0.1:") for spec in published.values())  # loopback by default
    assert named_mounts(rabbit, compose["volumes"]) == {"/var/lib/rabbitmq": "rabbitmq-data"}
    binds = {str(v).split(":")[1]: ROOT / str(v).split(":")[0] for v in rabbit["volumes"] if str(v).startswith("./")}
    assert binds.keys() == {"/etc/rabbitmq/conf.d/90-warren.conf", "/etc/rabbitmq/enabled_plugins"}
    assert all(path.is_file() for path in binds.values())
    test = rabbit["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "rabbitmq-diagnostics"
    assert duration_s(rabbit["healthcheck"]["interval"]) <= 30


def test_enabled_plugins_turn_on_management_and_prometheus() -> None:
    text = (ROOT / "deploy" / "enabled_plugins").read_text().strip()
    match = re.fullmatch(r"\[([a-z_,\s]*)\]\.", text)
    assert match, "enabled_plugins must be one Erlang list term ending with a dot"
    plugins = {p.strip() for p in match.group(1).split(",")}
    assert {"rabbitmq_management", "rabbitmq_prometheus"} <= plugins


def _rabbit_schema_keys() -> list[str]:
    keys: list[str] = []
    for root in (Path("/usr/lib/rabbitmq/lib"), Path("/opt/rabbitmq")):
        for schema in root.glob("**/priv/schema/*.schema") if root.is_dir() else []:
            keys += re.findall(r'\{mapping,\s*"([^"]+)"', schema.read_text(errors="replace"))
    return keys


def read_rabbitmq_conf(name: str) -> dict[str, str]:
    settings = {}
    for line in (ROOT / "deploy" / name).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"not key = value: {line!r}"
            settings[key.strip()] = value.strip()
    return settings


@pytest.mark.parametrize("name", ["rabbitmq.conf", "rabbitmq-cluster.conf"])
def test_rabbitmq_conf_uses_only_keys_the_broker_knows(name: str) -> None:
    settings = read_rabbitmq_conf(name)
    if name == "rabbitmq.conf":
        # Long collection tasks: above the broker's 30 min default.
        assert int(settings["consumer_timeout"]) >= 3_600_000
    known = _rabbit_schema_keys()
    if not known:
        pytest.skip("no local RabbitMQ schema files to check the keys against")
    patterns = [re.compile("^" + re.sub(r"\\\$[a-z_]+", r"[^.]+", re.escape(key)) + "$") for key in known]
    for key in settings:
        assert any(p.match(key) for p in patterns), f"rabbitmq.conf key {key!r} is unknown to RabbitMQ"


# -- the warren services ------------------------------------------------------------------


def test_every_warren_command_parses_with_the_real_cli() -> None:
    services = load_compose(EXAMPLE)["services"]
    parser = build_parser()
    for name in WARREN_SERVICES:
        command = service_command(services[name])
        assert command[0] == name
        args = parser.parse_args(command)
        assert args.command == name


def test_shared_volume_holds_data_policies_and_the_run_log() -> None:
    compose = load_compose(EXAMPLE)
    services = compose["services"]
    for name in WARREN_SERVICES:
        mounts = named_mounts(services[name], compose["volumes"])
        assert mounts == {"/data": "warren-data"}, name
        env = service_environment(services[name])
        assert env["WARREN_PATH_DATA"] == "/data/steps", name
        assert env["WARREN_PATH_POLICY"] == "/data/policy", name
    run_log = arg_after(service_command(services["coordinator"]), "--run-log")
    assert run_log.startswith("/data/")
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "mkdir -p /data/steps /data/policy /data/runs" in dockerfile  # owned by the image's user


def test_collectors_scale_and_stop_within_the_grace_period() -> None:
    collector = load_compose(EXAMPLE)["services"]["collector"]
    assert "container_name" not in collector
    assert "ports" not in collector
    env = service_environment(collector)
    assert "WARREN_WORKER_ID" not in env  # each replica's default id is unique
    assert collector["restart"] == "on-failure"
    grace = float(env["WARREN_STOP_GRACE_S"] or CollectorConfig().stop_grace_s)
    assert duration_s(collector["stop_grace_period"]) >= grace + 10


def test_job_variables_reach_the_coordinator_and_learner() -> None:
    variables = {
        **EXAMPLE,
        "WARREN_COLLECT_TASKS": "7",
        "WARREN_ENV_ID": "Acrobot-v1",
        "WARREN_STOP_VALUE": "-90",
        "WARREN_MAX_ENV_STEPS": "1234",
        "WARREN_MAX_TIME_S": "56",
        "WARREN_SEED": "9",
        "WARREN_COLLECTORS": "7",
    }
    services = load_compose(variables)["services"]
    coordinator = service_command(services["coordinator"])
    expected = {
        "--collect-tasks": "7",
        "--env-id": "Acrobot-v1",
        "--stop-value": "-90",
        "--max-env-steps": "1234",
        "--max-time-s": "56",
        "--seed": "9",
    }
    assert {flag: arg_after(coordinator, flag) for flag in expected} == expected
    learner = service_command(services["learner"])
    assert (arg_after(learner, "--env-id"), arg_after(learner, "--seed")) == ("Acrobot-v1", "9")
    assert services["collector"]["scale"] == "7"


def test_compose_defaults_are_warrens_defaults() -> None:
    services = load_compose({})["services"]
    job = JobConfig()
    coordinator = service_command(services["coordinator"])
    assert int(arg_after(coordinator, "--collect-tasks")) == job.coordinator.collect_tasks
    assert arg_after(coordinator, "--env-id") == job.env.id
    assert float(arg_after(coordinator, "--stop-value")) == job.env.stop_value
    assert int(arg_after(coordinator, "--max-env-steps")) == job.coordinator.max_env_steps
    assert float(arg_after(coordinator, "--max-time-s")) == job.coordinator.max_time_s
    assert int(arg_after(coordinator, "--seed")) == job.env.seed
    assert float(service_environment(services["collector"])["WARREN_STOP_GRACE_S"]) == CollectorConfig().stop_grace_s


def test_every_warren_setting_can_be_set_from_the_env_file() -> None:
    services = load_compose(EXAMPLE)["services"]
    transport = settings_variables() - NOT_IN_COMPOSE
    for name in WARREN_SERVICES:
        env = service_environment(services[name])
        assert transport <= env.keys(), f"{name} lacks {sorted(transport - env.keys())}"
    collector_env = service_environment(services["collector"])
    wanted = collector_variables() - NOT_IN_COMPOSE
    assert wanted <= collector_env.keys(), f"collector lacks {sorted(wanted - collector_env.keys())}"
    # Each is either fixed by the compose file or read from .env (empty: warren's default).
    template = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["collector"]["environment"]
    for variable in wanted | transport:
        raw = str(template[variable])
        if variable in FIXED_IN_COMPOSE:
            assert raw == FIXED_IN_COMPOSE[variable], variable
            continue
        assert raw.startswith("/data/") or f"${{{variable}" in raw or variable == "WARREN_AMQP_URL", variable


def test_empty_settings_fall_back_to_warrens_defaults() -> None:
    env = service_environment(load_compose({})["services"]["collector"])
    warren_env = {k: v for k, v in env.items() if k.startswith("WARREN_")}
    config = role_config(CollectorConfig, warren_env)
    assert config.transport.rpc_timeout_s == Settings().rpc_timeout_s
    assert config.transport.prefix == Settings().prefix
    assert config.handler_threads == CollectorConfig().handler_threads
    assert config.transport.connect_timeout_s >= 120  # containers start in any order
    assert config.path_data == Path("/data/steps")


def test_env_example_matches_the_compose_file() -> None:
    used = compose_variables()
    defaults = compose_defaults()
    assert set(EXAMPLE) <= used, f"unused in docker-compose.yml: {sorted(set(EXAMPLE) - used)}"
    for variable, value in EXAMPLE.items():
        assert '"' not in value and "'" not in value, f"{variable}: quotes are read differently by compose versions"
        if defaults.get(variable):
            assert value == defaults[variable], f"{variable}: .env.example {value!r} vs compose {defaults[variable]!r}"
    for variable in ("RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS", "WARREN_COLLECT_TASKS", "WARREN_COLLECTORS"):
        assert variable in EXAMPLE


def test_build_args_match_the_dockerfile() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    build_args = load_compose({})["services"]["collector"]["build"]["args"]
    assert set(build_args) == {"PYTHON_IMAGE", "TORCH_INDEX_URL", "TORCH_VERSION"}
    for name, value in build_args.items():
        assert f"ARG {name}={value}\n" in dockerfile, name


def test_images_are_parameters_with_the_official_images_as_defaults() -> None:
    defaults = load_compose({})["services"]
    assert defaults["rabbitmq"]["image"] == "rabbitmq:3.13-management"
    assert re.fullmatch(r"prom/prometheus:v3\.\d+\.\d+", defaults["prometheus"]["image"])
    assert defaults["collector"]["build"]["args"]["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    local = {
        "RABBITMQ_IMAGE": "localhost/r:1",
        "PROMETHEUS_IMAGE": "localhost/m:1",
        "PYTHON_IMAGE": "localhost/p:1",
        "WARREN_IMAGE": "localhost/w:1",
    }
    services = load_compose(local)["services"]
    assert services["rabbitmq"]["image"] == "localhost/r:1"
    assert services["prometheus"]["image"] == "localhost/m:1"
    for name in WARREN_SERVICES:
        assert services[name]["build"]["args"]["PYTHON_IMAGE"] == "localhost/p:1", name
        assert services[name]["image"] == "localhost/w:1", name
    assert {"RABBITMQ_IMAGE", "PROMETHEUS_IMAGE", "PYTHON_IMAGE", "WARREN_IMAGE"} <= set(EXAMPLE)


# -- Prometheus and TensorBoard ----------------------------------------------------------------


def scrape_jobs(path: Path) -> dict[str, dict[str, Any]]:
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_every_warren_role_serves_metrics_and_writes_tensorboard_events_to_the_volume() -> None:
    services = load_compose(EXAMPLE)["services"]
    for name in WARREN_SERVICES:
        env = service_environment(services[name])
        assert {k: env[k] for k in FIXED_IN_COMPOSE} == FIXED_IN_COMPOSE, name
        assert "ports" not in services[name], name  # scraped inside the compose network only
    for name in ("coordinator", "learner"):
        assert arg_after(service_command(services[name]), "--tensorboard-dir") == "/data/runs/tensorboard", name
    config = role_config(CollectorConfig, service_environment(services["collector"]))
    assert (config.metrics_port, config.metrics_addr) == (9464, "0.0.0.0")


def test_prometheus_scrapes_the_broker_and_every_warren_role_by_its_service_name() -> None:
    compose = load_compose(EXAMPLE)
    services = compose["services"]
    jobs = scrape_jobs(PROMETHEUS_CONFIG)
    assert jobs["rabbitmq"]["static_configs"] == [{"targets": ["rabbitmq:15692"]}]
    port = int(FIXED_IN_COMPOSE["WARREN_METRICS_PORT"])
    for name in WARREN_SERVICES:
        # DNS: the service name resolves to each of its containers, so --scale needs no change here.
        (dns,) = jobs[f"warren-{name}"]["dns_sd_configs"]
        assert (dns["names"], dns["type"], dns["port"]) == ([name], "A", port), name
    assert set(jobs) == {"rabbitmq", *(f"warren-{name}" for name in WARREN_SERVICES)}
    prometheus = services["prometheus"]
    binds = {
        str(v).split(":")[1]: ROOT / str(v).split(":")[0] for v in prometheus["volumes"] if str(v).startswith("./")
    }
    assert binds == {"/etc/prometheus/prometheus.yml": PROMETHEUS_CONFIG}
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert "--storage.tsdb.path=/prometheus" in prometheus["command"]
    assert named_mounts(prometheus, compose["volumes"]) == {"/prometheus": "prometheus-data"}
    (published,) = prometheus["ports"]
    assert published == "127.0.0.1:9090:9090"  # loopback by default, like the broker's


def test_the_cluster_prometheus_config_differs_only_in_the_brokers_it_scrapes(tmp_path: Path) -> None:
    single, cluster = scrape_jobs(PROMETHEUS_CONFIG), scrape_jobs(PROMETHEUS_CLUSTER_CONFIG)
    (targets,) = cluster["rabbitmq"].pop("static_configs")
    single["rabbitmq"].pop("static_configs")
    assert cluster == single
    assert sorted(targets["targets"]) == [f"rabbitmq-{i}:15692" for i in (1, 2, 3)]
    services = cluster_config(tmp_path)["services"]
    configs = [
        str(v) for v in services["prometheus"]["volumes"] if str(v).endswith("/etc/prometheus/prometheus.yml:ro")
    ]
    assert configs == [f"{PROMETHEUS_CLUSTER_CONFIG}:/etc/prometheus/prometheus.yml:ro"]


def test_the_local_prometheus_image_starts_like_the_official_one() -> None:
    containerfile = (ROOT / "deploy" / "local-images" / "prometheus" / "Containerfile").read_text()
    assert 'ENTRYPOINT ["/usr/bin/prometheus"]' in containerfile  # the service's command is its arguments
    assert "USER 65534:65534" in containerfile and "WORKDIR /prometheus" in containerfile
    script = (ROOT / "scripts" / "local-images").read_text()
    assert 'echo "PROMETHEUS_IMAGE=$PROMETHEUS_TAG"' in script
    assert "PROMETHEUS_PACKAGES=prometheus" in script


def test_docs_describe_every_variable() -> None:
    docs = DOCS.read_text()
    for variable in sorted(compose_variables() | settings_variables() | collector_variables()):
        assert f"`{variable}`" in docs, f"docs/compose.md does not mention {variable}"


def _doc_default(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Path) and not value.is_absolute():
        return f"./{value}"
    return str(value)


def test_docs_state_warrens_real_defaults() -> None:
    rows = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^\| `(WARREN_[A-Z_]+)` \| ([^|]*) \|", DOCS.read_text(), re.MULTILINE)
    }
    configs: list[Any] = [Settings(), CollectorConfig()]
    for config in configs:
        for field in dataclasses.fields(config):
            value = getattr(config, field.name)
            if field.name in ("transport", "worker_id") or value == "":
                continue
            variable = "WARREN_" + field.name.upper()
            assert f"`{_doc_default(value)}`" in rows[variable], f"{variable}: docs say {rows[variable]!r}"


def test_interpolation_forms() -> None:
    variables = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET}-${UNSET}-$SET-$$SET", variables) == "x--x-$SET"
    assert interpolate("${EMPTY:-d}|${EMPTY-d}|${UNSET-d}|${SET:-d}", variables) == "d||d|x"
    with pytest.raises(ValueError, match="UNSET: needed"):
        interpolate("${UNSET:?needed}", variables)


# -- the cluster override (docker-compose.cluster.yml) -----------------------------------

CLUSTER_NODES = ("rabbitmq", "rabbitmq-2", "rabbitmq-3")
CLUSTER_CONF_TARGET = "/etc/rabbitmq/conf.d/91-warren-cluster.conf"
NODE_ENTRYPOINT = ROOT / "deploy" / "cluster-node"


#: A cookie of the user's own, as .env.example says to make one (it ships none).
OWN_COOKIE = "0123456789abcdef" * 4


def cluster_config(tmp_path: Path, **overrides: str) -> dict[str, Any]:
    env_file = tmp_path / "cluster.env"
    values = {**EXAMPLE, "RABBITMQ_CLUSTER_COOKIE": OWN_COOKIE, **overrides}
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return docker_compose_config(env_file, COMPOSE_FILE, CLUSTER_FILE)


def test_the_cluster_override_runs_three_nodes_that_reach_each_other_by_their_node_names(tmp_path: Path) -> None:
    rendered = cluster_config(tmp_path)
    services = rendered["services"]
    assert set(services) == {*CLUSTER_NODES, "prometheus", *WARREN_SERVICES}
    listed = read_rabbitmq_conf("rabbitmq-cluster.conf")
    assert listed["cluster_formation.peer_discovery_backend"] == "classic_config"
    peers = {v for k, v in listed.items() if k.startswith("cluster_formation.classic_config.nodes.")}
    hostnames = {services[name]["hostname"] for name in CLUSTER_NODES}
    assert peers == {f"rabbit@{host}" for host in hostnames} == {f"rabbit@rabbitmq-{i}" for i in (1, 2, 3)}
    data_volumes = set()
    for name in CLUSTER_NODES:
        node = services[name]
        host = node["hostname"]
        # The node name rabbit@<hostname> must resolve for the other nodes: service name or alias.
        assert host == name or host in node["networks"]["default"]["aliases"], name
        mounts = named_mounts(node, rendered["volumes"])
        data_volumes.add(mounts["/var/lib/rabbitmq"])
        binds = {str(v).split(":")[1]: Path(str(v).split(":")[0]) for v in node["volumes"] if str(v).startswith("/")}
        assert binds[CLUSTER_CONF_TARGET] == ROOT / "deploy" / "rabbitmq-cluster.conf", name
        assert binds["/etc/rabbitmq/conf.d/90-warren.conf"] == ROOT / "deploy" / "rabbitmq.conf", name
        assert binds[node["entrypoint"][1]] == NODE_ENTRYPOINT, name
        # An entrypoint of the service's own drops the image's CMD: the service gives it back.
        assert node["entrypoint"][0] == "/bin/sh" and node["command"] == image_command(), name
        assert node["environment"]["RABBITMQ_CLUSTER_COOKIE"] == OWN_COOKIE, name
        assert "rabbitmq-diagnostics" in node["healthcheck"]["test"], name
        assert node["image"] == services["rabbitmq"]["image"], name
    assert len(data_volumes) == 3 and "rabbitmq-data" not in data_volumes  # each its own, none the single broker's
    for name in ("rabbitmq-2", "rabbitmq-3"):  # join a running first node rather than race it
        assert services[name]["depends_on"] == {"rabbitmq": {"condition": "service_healthy"}}
        assert "ports" not in services[name]
    assert services["rabbitmq"]["ports"]  # the single broker's published ports stay on node 1


def test_the_cluster_override_points_every_role_at_all_three_nodes_with_quorum_queues(tmp_path: Path) -> None:
    single = docker_compose_config(ENV_EXAMPLE)["services"]
    services = cluster_config(tmp_path)["services"]
    hosts = {services[name]["hostname"] for name in CLUSTER_NODES}
    for name in WARREN_SERVICES:
        env = services[name]["environment"]
        urls = [urlsplit(url) for url in env["WARREN_AMQP_URL"].split(",")]
        assert {url.hostname for url in urls} == hosts, name
        for url in urls:
            assert (url.scheme, url.port, unquote(url.path)) == ("amqp", 5672, "//"), name
            assert (url.username, url.password) == (EXAMPLE["RABBITMQ_DEFAULT_USER"], EXAMPLE["RABBITMQ_DEFAULT_PASS"])
        assert env["WARREN_QUEUE_TYPE"] == "quorum", name
        # Everything else is the single-broker file's, untouched.
        others = {k: v for k, v in env.items() if k not in ("WARREN_AMQP_URL", "WARREN_QUEUE_TYPE")}
        assert others == {k: v for k, v in single[name]["environment"].items() if k in others}, name
        assert others.keys() == single[name]["environment"].keys() - {"WARREN_AMQP_URL", "WARREN_QUEUE_TYPE"}
        assert services[name]["command"] == single[name]["command"], name
        # A quorum queue's members are the nodes running when it is declared: wait for all three.
        for node in CLUSTER_NODES:
            assert services[name]["depends_on"][node] == {"condition": "service_healthy"}, (name, node)
    assert services["coordinator"]["depends_on"]["learner"] == {"condition": "service_started"}
    assert services["collector"]["scale"] == single["collector"]["scale"]


def test_the_single_broker_file_does_not_change_with_the_cluster_variables(tmp_path: Path) -> None:
    env_file = tmp_path / "with-cookie.env"
    env_file.write_text(ENV_EXAMPLE.read_text() + f"RABBITMQ_CLUSTER_COOKIE={OWN_COOKIE}\n")
    assert docker_compose_config(env_file) == docker_compose_config(ENV_EXAMPLE)


def test_the_cluster_refuses_to_start_without_a_cookie(tmp_path: Path) -> None:
    env_file = tmp_path / "no-cookie.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in EXAMPLE.items() if k != "RABBITMQ_CLUSTER_COOKIE"))
    done = run_docker_compose_config(env_file, COMPOSE_FILE, CLUSTER_FILE)
    assert done.returncode != 0
    assert "RABBITMQ_CLUSTER_COOKIE" in done.stderr


def test_env_example_ships_no_cluster_cookie_so_a_copied_env_cannot_start_the_cluster() -> None:
    # cp .env.example .env must not give every cluster the same, published Erlang cookie.
    assert "RABBITMQ_CLUSTER_COOKIE" in EXAMPLE and EXAMPLE["RABBITMQ_CLUSTER_COOKIE"] == ""
    done = run_docker_compose_config(ENV_EXAMPLE, COMPOSE_FILE, CLUSTER_FILE)
    assert done.returncode != 0 and "RABBITMQ_CLUSTER_COOKIE" in done.stderr
    assert "openssl rand" in done.stderr  # and says how to make one


def image_command() -> list[str]:
    """The broker image's CMD, as the local image's Containerfile (and the official image) set it."""
    containerfile = (ROOT / "deploy" / "local-images" / "rabbitmq" / "Containerfile").read_text()
    match = re.search(r"^CMD (\[.*\])$", containerfile, re.MULTILINE)
    assert match is not None
    command: list[str] = json.loads(match.group(1))
    return command


def run_node_entrypoint(tmp_path: Path, cookie: str | None, entrypoints: tuple[str, ...]) -> tuple[int, str]:
    """Run deploy/cluster-node with stand-ins for the images' entry points, which report what they got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in entrypoints:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "{name} $* cookie-var=${{RABBITMQ_CLUSTER_COOKIE:-unset}}"\n')
        stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "WARREN_COOKIE_FILE": str(tmp_path / ".erlang.cookie")}
    if cookie is not None:
        env["RABBITMQ_CLUSTER_COOKIE"] = cookie
    done = subprocess.run(
        ["/bin/sh", str(NODE_ENTRYPOINT), "start", "--the-node"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    "entrypoints", [("docker-entrypoint.sh",), ("rabbitmq-entrypoint",)], ids=["official", "local"]
)
def test_the_node_entrypoint_writes_an_owner_only_cookie_then_runs_the_images_own(
    tmp_path: Path, entrypoints: tuple[str, ...]
) -> None:
    cookie_file = tmp_path / ".erlang.cookie"
    cookie_file.write_text("left-by-an-earlier-start")
    cookie_file.chmod(0o400)
    code, output = run_node_entrypoint(tmp_path, OWN_COOKIE, entrypoints)
    assert code == 0, output
    assert output.strip() == f"{entrypoints[0]} start --the-node cookie-var=unset"  # arguments passed on
    assert cookie_file.read_text() == OWN_COOKIE  # .env wins over the volume
    assert cookie_file.stat().st_mode & 0o777 == 0o400  # Erlang refuses a cookie others can read


@pytest.mark.parametrize(
    "cookie",
    ["", "change-me-warren-cluster-cookie", "short-cookie-0123"],
    ids=["empty", "the-published-placeholder", "too-short"],
)
def test_the_node_entrypoint_refuses_a_cookie_anyone_could_know(tmp_path: Path, cookie: str) -> None:
    code, output = run_node_entrypoint(tmp_path, cookie, ("docker-entrypoint.sh",))
    assert code == 64 and "RABBITMQ_CLUSTER_COOKIE" in output
    assert not (tmp_path / ".erlang.cookie").exists()
    assert "docker-entrypoint.sh" not in output  # the server never started


def test_both_images_read_the_cookie_where_the_node_entrypoint_writes_it() -> None:
    # The official image sets HOME=/var/lib/rabbitmq; the local image's entry point gives
    # the server the same HOME, and Erlang reads $HOME/.erlang.cookie.
    written = re.search(r"cookie_file=\$\{WARREN_COOKIE_FILE:-([^}]+)\}", NODE_ENTRYPOINT.read_text())
    assert written is not None and written.group(1) == "/var/lib/rabbitmq/.erlang.cookie"
    local = (ROOT / "deploy" / "local-images" / "rabbitmq" / "entrypoint").read_text()
    assert "HOME=/var/lib/rabbitmq" in local
    assert "rabbitmq-entrypoint" in (ROOT / "deploy" / "local-images" / "rabbitmq" / "Containerfile").read_text()
