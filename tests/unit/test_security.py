"""Security rules checked on the source itself, and the TLS and redaction behaviour (no broker).

* **Credentials**: the only credentials written anywhere in the repository are RabbitMQ's
  local default ``guest:guest@localhost`` (the broker refuses ``guest`` from any other
  host, so it opens nothing) and ``${...}`` templates; in ``messaging/`` and ``worker/``
  the default lives in ``messaging/settings.py`` and may be quoted in ``--help`` texts,
  and no other password-looking literal exists. Tests may hold fake ones.
* **Deserialisation**: ``messaging/`` and ``worker/`` never unpickle (``pickle``,
  ``marshal``, ``dill``, ``shelve``...), call ``torch.load`` without ``weights_only=True``,
  ``numpy.load`` with ``allow_pickle=True``, ``yaml.load`` without a safe loader, or
  ``eval``/``exec``. The check reads the AST and follows import aliases.
* **TLS**: ``amqps://`` gives pika SSL options that verify the broker against the given
  CA, with the URL's host as server name.
* **Redaction**: a failed connection never shows the password, in the error, its chain,
  or any log record; neither does the repr of the settings.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from messaging import Settings
from messaging.connection import connect, parameters
from messaging.errors import ConnectionFailed, WarrenError

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("messaging", "worker")
#: The one place the local default URL is defined.
DEFAULT_HOME = "messaging/settings.py"
LOCAL_DEFAULT = "guest:guest@localhost"


# -- the files of the repository --------------------------------------------------------


def repo_files() -> list[Path]:
    """Tracked files plus new ones not ignored (what a commit would add); a walk without git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout.decode()
        names = [n for n in listed.split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", "runs"}
        names = [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def text_of(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:4096]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def code_files() -> list[Path]:
    return sorted(p for p in repo_files() if p.suffix == ".py" and p.relative_to(ROOT).parts[0] in CODE_DIRS)


def test_the_scan_sees_the_code() -> None:
    names = {str(p.relative_to(ROOT)) for p in code_files()}
    assert {"messaging/settings.py", "messaging/connection.py", "worker/storage/policies.py"} <= names


# -- credentials ------------------------------------------------------------------------

#: scheme://user:password@host, with the parts a URL may hold.
CREDENTIAL_URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([^\s/:@\"'`<>]+):([^\s/@\"'`<>]+)@([^\s/:\"'`<>?#]+)")


def credential_problems(path: str, text: str) -> list[str]:
    """Credentialed URLs in ``text`` that are neither the local default nor a template."""
    problems = []
    for match in CREDENTIAL_URL.finditer(text):
        user, password, host = match.group(2), match.group(3), match.group(4)
        if "$" in match.group(0):  # ${VAR} / $VAR templates (compose files, shell scripts)
            continue
        if (user, password) == ("guest", "guest") and host in ("localhost", "127.0.0.1"):
            continue
        if password == "***":  # already redacted
            continue
        line = text.count("\n", 0, match.start()) + 1
        problems.append(f"{path}:{line}: {match.group(0)}")
    return problems


def test_the_credential_rule_catches_real_looking_credentials() -> None:
    assert credential_problems("x", "url = 'amqp://warren:hunter2@broker:5672/%2F'")
    assert credential_problems("x", "amqps://guest:guest@rabbit.example.com/")  # guest off-host: a real account
    assert not credential_problems("x", "amqp://guest:guest@localhost:5672/%2F")
    assert not credential_problems("x", "amqp://${USER:-warren}:${PASS:-change-me}@rabbitmq:5672/%2F")


def test_no_credentials_in_the_repository_but_the_local_default_and_templates() -> None:
    problems = []
    for path in repo_files():
        rel = str(path.relative_to(ROOT))
        if rel.startswith("tests/"):
            continue  # fake credentials for redaction tests
        text = text_of(path)
        if text is not None:
            problems += credential_problems(rel, text)
    assert not problems, "credentials in the repository:\n" + "\n".join(problems)


def test_the_env_example_holds_placeholders_only() -> None:
    example = ROOT / ".env.example"
    if not example.exists():
        pytest.skip("no .env.example")
    values = dict(
        line.split("=", 1) for line in example.read_text().splitlines() if "=" in line and not line.startswith("#")
    )
    secrets = {k: v for k, v in values.items() if re.search(r"PASS|SECRET|TOKEN|KEY", k) and v}
    assert all("change-me" in v for v in secrets.values()), secrets
    assert ".env" not in {str(p.relative_to(ROOT)) for p in repo_files()}


_SECRET_NAME = re.compile(r"(?i)(^|_)(pass(word|wd)?|secret|token|api_?key|credentials?|auth)($|_)")


def _literal_string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
        return node.value
    return None


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def secret_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Non-empty string literals bound to secret-looking names, and literal pika credentials."""
    found: list[tuple[int, str]] = []

    def name_of(target: ast.AST) -> str | None:
        if isinstance(target, ast.Name):
            return target.id
        if isinstance(target, ast.Attribute):
            return target.attr
        return None

    for node in ast.walk(tree):
        pairs: list[tuple[str | None, ast.AST | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(name_of(t), node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign):
            pairs = [(name_of(node.target), node.value)]
        elif isinstance(node, ast.keyword):
            pairs = [(node.arg, node.value)]
        elif isinstance(node, ast.Dict):
            pairs = [(_literal_string(k), v) for k, v in zip(node.keys, node.values, strict=True)]
        elif (
            isinstance(node, ast.Call)
            and _callee(node) in ("PlainCredentials", "ExternalCredentials")
            and any(_literal_string(a) for a in node.args)
        ):
            found.append((node.lineno, "literal pika credentials"))
        for name, value in pairs:
            if name and _SECRET_NAME.search(name) and _literal_string(value):
                found.append((getattr(node, "lineno", 0), f"{name} = {_literal_string(value)!r}"))
    return found


def guest_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals holding the guest default that are not an argparse ``help=`` text."""
    in_help: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "help":
            in_help |= {id(n) for n in ast.walk(node.value)}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and LOCAL_DEFAULT.split("@", maxsplit=1)[0] in node.value
        and id(node) not in in_help
    ]


def test_secret_checks_catch_what_they_look_for() -> None:
    bad = ast.parse(
        "password = 's3cret'\n"
        "self.api_key = 'abc'\n"
        "connect(auth_token='t')\n"
        "cfg = {'secret': 'x'}\n"
        "pika.PlainCredentials('warren', 'hunter2')\n"
        "URL = 'amqp://guest:guest@localhost/'\n"
    )
    assert len(secret_literals(bad)) == 5
    assert len(guest_literals(bad)) == 1
    good = ast.parse(
        "password = os.environ['X']\nparser.add_argument('--url', help='default amqp://guest:guest@localhost/')\n"
    )
    assert secret_literals(good) == [] and guest_literals(good) == []


def test_no_password_literals_in_messaging_and_worker() -> None:
    problems = []
    for path in code_files():
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(), rel)
        problems += [f"{rel}:{line}: {what}" for line, what in secret_literals(tree)]
        if rel != DEFAULT_HOME:
            problems += [f"{rel}:{line}: the guest default outside {DEFAULT_HOME}" for line, _ in guest_literals(tree)]
    assert not problems, "\n".join(problems)
    home = ast.parse((ROOT / DEFAULT_HOME).read_text())
    assert [value for _, value in guest_literals(home)] == ["amqp://guest:guest@localhost:5672/%2F"]


# -- unsafe deserialisation -----------------------------------------------------------

#: Calls that unpickle (or run code) whatever their arguments.
ALWAYS_UNSAFE = frozenset(
    {
        "pickle.load",
        "pickle.loads",
        "pickle.Unpickler",
        "_pickle.load",
        "_pickle.loads",
        "_pickle.Unpickler",
        "cPickle.load",
        "cPickle.loads",
        "dill.load",
        "dill.loads",
        "cloudpickle.load",
        "cloudpickle.loads",
        "joblib.load",
        "marshal.load",
        "marshal.loads",
        "shelve.open",
        "pandas.read_pickle",
        "torch.serialization.load",
        "yaml.unsafe_load",
        "yaml.unsafe_load_all",
        "yaml.full_load",
        "yaml.full_load_all",
        "eval",
        "exec",
    }
)
SAFE_YAML_LOADERS = ("SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader")


@dataclass(frozen=True)
class Finding:
    line: int
    call: str
    why: str


def _aliases(tree: ast.AST) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


#: Loaders of weights that cannot run code: what the policy reader must call.
SAFE_WEIGHT_LOADERS = frozenset(
    {"safetensors.torch.load", "safetensors.numpy.load", "safetensors.torch.load_file", "safetensors.safe_open"}
)


def unsafe_calls(tree: ast.AST) -> tuple[list[Finding], int]:
    """Unsafe deserialising calls in ``tree``, and how many weight loaders (``torch.load``, safetensors) were seen."""
    aliases = _aliases(tree)
    findings: list[Finding] = []
    torch_loads = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name is None:
            continue
        if name in ALWAYS_UNSAFE:
            findings.append(Finding(node.lineno, name, "deserialises or runs arbitrary code"))
        elif name in SAFE_WEIGHT_LOADERS:
            torch_loads += 1
        elif name == "torch.load":
            torch_loads += 1
            if not _is_true(_keyword(node, "weights_only")):
                findings.append(Finding(node.lineno, name, "without weights_only=True"))
        elif name == "numpy.load" and _keyword(node, "allow_pickle") is not None:
            if not (
                isinstance(_keyword(node, "allow_pickle"), ast.Constant)
                and not _is_true(_keyword(node, "allow_pickle"))
            ):
                findings.append(Finding(node.lineno, name, "with allow_pickle"))
        elif name in ("yaml.load", "yaml.load_all"):
            loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            loader_name = _dotted(loader, aliases) if loader is not None else None
            if loader_name is None or not loader_name.endswith(SAFE_YAML_LOADERS):
                findings.append(Finding(node.lineno, name, f"with loader {loader_name}"))
    return findings, torch_loads


def test_the_deserialisation_check_catches_what_it_looks_for() -> None:
    bad = ast.parse(
        "import pickle, torch, yaml\n"
        "import numpy as np\n"
        "from pickle import loads as l\n"
        "from torch import load\n"
        "pickle.load(f)\n"
        "l(b)\n"
        "torch.load(f)\n"
        "load(f, weights_only=False)\n"
        "torch.load(f, weights_only=flag)\n"
        "np.load(f, allow_pickle=True)\n"
        "yaml.load(s)\n"
        "yaml.load(s, Loader=yaml.Loader)\n"
        "yaml.unsafe_load(s)\n"
        "eval(s)\n"
    )
    findings, loads = unsafe_calls(bad)
    assert [f.line for f in findings] == list(range(5, 15)), findings
    assert loads == 3
    good = ast.parse(
        "import torch, yaml\nimport numpy as np\n"
        "from safetensors.torch import load\n"
        "torch.load(f, map_location='cpu', weights_only=True)\n"
        "np.load(f)\nnp.load(f, allow_pickle=False)\n"
        "yaml.load(s, Loader=yaml.SafeLoader)\nyaml.safe_load(s)\n"
        "pickle.UnpicklingError\n"
        "load(body)\n"
    )
    assert unsafe_calls(good) == ([], 2)


def test_no_unsafe_deserialisation_in_messaging_and_worker() -> None:
    problems = []
    torch_loads = 0
    for path in code_files():
        rel = str(path.relative_to(ROOT))
        findings, loads = unsafe_calls(ast.parse(path.read_text(), rel))
        torch_loads += loads
        problems += [f"{rel}:{f.line}: {f.call} {f.why}" for f in findings]
    assert not problems, "\n".join(problems)
    assert torch_loads >= 1  # the policy reader: proof that the check saw the call it guards


# -- imports a message could cause ------------------------------------------------------

#: Calls that import a module named at run time.
DYNAMIC_IMPORTS = frozenset(
    {
        "importlib.import_module",
        "importlib.__import__",
        "__import__",
        "importlib.util.spec_from_file_location",
        "importlib.util.module_from_spec",
        "importlib.machinery.SourceFileLoader",
        "runpy.run_module",
        "runpy.run_path",
        "pydoc.locate",
    }
)
#: The one module that imports plug-ins: at process start, from installed entry points and the allowlist.
PLUGIN_LOADER = "worker/plugins/registry.py"


def dynamic_imports(tree: ast.AST) -> list[tuple[int, str]]:
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func, aliases)
            if name in DYNAMIC_IMPORTS:
                found.append((node.lineno, name))
    return found


def test_the_dynamic_import_check_catches_what_it_looks_for() -> None:
    tree = ast.parse(
        "import importlib, runpy\nfrom importlib import import_module as im\n"
        "importlib.import_module(name)\nim(name)\n__import__(name)\nrunpy.run_path(p)\nimportlib.reload(m)\n"
    )
    assert [line for line, _ in dynamic_imports(tree)] == [3, 4, 5, 6]


def test_only_the_plugin_registry_imports_modules_by_name() -> None:
    # No message may make a worker import a module: a task names plug-ins, which the
    # registry imported at start from installed entry points; nothing else imports by name.
    seen: dict[str, list[tuple[int, str]]] = {}
    for path in code_files():
        rel = str(path.relative_to(ROOT))
        found = dynamic_imports(ast.parse(path.read_text(), rel))
        if found:
            seen[rel] = found
    assert set(seen) == {PLUGIN_LOADER}, seen


# -- TLS --------------------------------------------------------------------------------


OPENSSL_CA = ("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=warren-test-ca")


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed CA certificate made with openssl."""
    if shutil.which("openssl") is None:
        # scripts/test installs it; in CI a missing tool is a broken setup, not a reason to skip.
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("openssl is not installed (scripts/test installs Debian's package)")
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("ca")
    subprocess.run(
        [*OPENSSL_CA, "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return folder / "ca.pem"


def test_amqps_verifies_the_broker_against_the_given_ca(ca_file: Path) -> None:
    settings = Settings(amqp_url="amqps://u:p@host:5671/%2F", amqp_ca_file=str(ca_file))
    params = parameters(settings, "role")
    assert params.ssl_options is not None
    assert params.ssl_options.server_hostname == "host"
    assert (params.host, params.port) == ("host", 5671)
    context = params.ssl_options.context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is True
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    subjects = [dict(pair[0] for pair in cert["subject"]) for cert in context.get_ca_certs()]
    assert {"commonName": "warren-test-ca"} in subjects


def test_plain_amqp_has_no_tls() -> None:
    assert parameters(Settings(amqp_url="amqp://u:p@host:5672/%2F"), "role").ssl_options is None


@pytest.mark.parametrize("kind", ["missing", "not a certificate"])
def test_an_unusable_ca_file_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    ca = tmp_path / "ca.pem"
    if kind == "not a certificate":
        ca.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    # A warren error naming the file (the roles print those and exit), not an OSError traceback;
    # raised when the settings are built or when the connection parameters are.
    with pytest.raises(WarrenError) as info:
        parameters(Settings(amqp_url="amqps://u:p@host:5671/%2F", amqp_ca_file=str(ca)), "role")
    assert str(ca) in info.value.message


# -- redaction --------------------------------------------------------------------------

SECRET = "Sup3r-s3cret-pw"
SECRET_ENCODED = "Sup3r%40s3cret%3Apw"  # decodes to Sup3r@s3cret:pw


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


@pytest.mark.parametrize("scheme", ["amqp", "amqps"])
@pytest.mark.parametrize("password", [SECRET, SECRET_ENCODED])
def test_a_failed_connection_never_shows_the_password(
    scheme: str, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = closed_port()
    settings = Settings(amqp_url=f"{scheme}://alice:{password}@127.0.0.1:{port}/%2F", connect_timeout_s=0.5)
    forms = {password, SECRET, "Sup3r@s3cret:pw"}
    with caplog.at_level(logging.DEBUG), pytest.raises(ConnectionFailed) as info:
        connect(settings, "redaction-test")
    message = str(info.value)
    assert "alice:***@127.0.0.1" in message and str(port) in message
    for exc in _chain(info.value):
        assert not any(form in str(exc) or form in repr(exc) for form in forms), repr(exc)
    for record in caplog.records:
        text = record.getMessage() + (caplog.text or "")
        assert not any(form in text for form in forms), text


def test_settings_do_not_show_the_password_in_their_repr() -> None:
    settings = Settings(amqp_url=f"amqp://alice:{SECRET}@broker:5672/%2F")
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert settings.amqp_url.endswith("@broker:5672/%2F")  # the real URL is still there to connect with
