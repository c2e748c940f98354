"""dbvt-server's settings: --version, the defaults --help states, and refused values traced to their source."""
from __future__ import annotations

import os
import subprocess

import pytest

from dbvt_server import __version__
from dbvt_server.config import SETTINGS, Config, parse
from dbvt_server.cores import usable_cores
from servers import NEUTRAL_DIR, server_command


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*server_command(), *args], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_DIR,
                          env={**os.environ, **(env or {})})


def test_version():
    shown = _run("--version")
    assert (shown.returncode, shown.stdout) == (0, f"dbvt-server {__version__}\n")
    assert __version__ == "0.1.0"


def test_help_states_the_workers_rule_not_this_machines_count():
    shown = _run("--help")
    text = " ".join(shown.stdout.split())
    assert "[env DBVT_WORKERS; default the cores this process may use, at least 2]" in text
    assert "[env DBVT_CORES; default the cores this process may use: its CPU affinity, or fewer under a CPU " \
           "quota]" in text
    assert Config().workers == max(2, usable_cores()) and Config().cores == usable_cores()


def test_a_refused_variable_is_named():
    shown = _run(env={"DBVT_WORKERS": "0"})
    assert shown.returncode == 2
    assert shown.stderr.splitlines()[-1] == \
        "dbvt-server: error: environment variable DBVT_WORKERS=0: workers must be positive"


def test_a_refused_flag_is_named():
    shown = _run("--workers", "0")
    assert shown.returncode == 2
    assert shown.stderr.splitlines()[-1] == "dbvt-server: error: --workers 0: workers must be positive"


# A refused value of every validated setting, and what it is told.
REFUSED = [
    ("port", "70000", "port must be between 0 and 65535"),
    ("max_message_bytes", "8191", "max_message_bytes must be between 8192 (room for rows beside a message's other "
                                  "fields) and 2147483647 (gRPC's limit)"),
    ("max_message_bytes", "2147483648", "max_message_bytes must be between 8192 (room for rows beside a message's "
                                        "other fields) and 2147483647 (gRPC's limit)"),
    ("max_worlds", "0", "max_worlds must be positive"),
    ("max_proxies_per_world", "-5", "max_proxies_per_world must be positive"),
    ("grace_seconds", "-1.0", "grace_seconds must be a finite number >= 0"),
    ("grace_seconds", "nan", "grace_seconds must be a finite number >= 0"),
    ("log_level", "loud", "log_level must be one of DEBUG, INFO, WARNING, ERROR"),
    ("workers", "0", "workers must be positive"),
    ("threads_per_world", "0", "threads_per_world must be between 1 and 1024"),
    ("threads_per_world", "1025", "threads_per_world must be between 1 and 1024"),
    ("cores", "0", "cores must be between 1 and 1024"),
]


@pytest.mark.parametrize("name, value, told", REFUSED)
def test_every_refused_setting_names_its_source(name, value, told, capsys):
    env = "DBVT_" + name.upper()
    with pytest.raises(SystemExit):
        parse([], environ={env: value})
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"dbvt-server: error: environment variable {env}={value}: {told}"
    flag = "--" + name.replace("_", "-")
    with pytest.raises(SystemExit):
        parse([flag, value], environ={})
    assert capsys.readouterr().err.splitlines()[-1] == f"dbvt-server: error: {flag} {value}: {told}"


def test_a_flag_overrides_a_refused_variable():
    assert parse(["--workers", "3"], environ={"DBVT_WORKERS": "0"}).workers == 3


KINDS = {setting.name: setting.kind for setting in SETTINGS}


@pytest.mark.parametrize("name, value, told", REFUSED)
def test_a_config_made_in_code_is_held_to_the_same_rules(name, value, told):
    typed = KINDS[name](value)
    with pytest.raises(ValueError) as refused:
        Config(**{name: typed})
    assert str(refused.value) == f"Config({name}={typed!r}): {told}"


@pytest.mark.parametrize("settings, told", [
    ({"port": "50051"}, "Config(port='50051'): port must be int"),
    ({"workers": True}, "Config(workers=True): workers must be int"),
    ({"host": None}, "Config(host=None): host must be str"),
    ({"grace_seconds": "1"}, "Config(grace_seconds='1'): grace_seconds must be float"),
    ({"listen": "127.0.0.1:0"}, "Config(listen='127.0.0.1:0'): listen must be a tuple of str"),
    ({"peers": ["a:1"]}, "Config(peers=['a:1']): peers must be a tuple of str"),
])
def test_a_config_value_of_the_wrong_type_is_named(settings, told):
    with pytest.raises(TypeError) as refused:
        Config(**settings)
    assert str(refused.value) == told


@pytest.mark.parametrize("settings, told", [
    ({"tls_cert": "c.pem"}, "Config: tls_cert needs tls_key as well"),
    ({"tls_client_ca": "ca.pem"}, "Config: tls_client_ca needs tls_cert as well"),
    ({"peers": ("a:1", "b:2")}, "Config: peers needs advertise as well"),
    ({"peers": ("a:1",), "advertise": "c:3"}, "Config: advertise c:3 must be one of peers a:1"),
    ({"peers": ("dns:///x:1", "a:1"), "advertise": "a:1"},
     "Config: peers takes host:port addresses or one dns:/// name, not both: dns:///x:1,a:1"),
])
def test_a_config_s_settings_are_checked_together(settings, told):
    with pytest.raises(ValueError) as refused:
        Config(**settings)
    assert str(refused.value) == told


def test_a_config_takes_what_the_flags_take():
    made = Config(port=0, keepalive_seconds=5, listen=("127.0.0.1:0",), tls_cert="c.pem", tls_key="k.pem",
                  health_port=None, peers=("a:1",), advertise="a:1")
    assert made == parse(["--port", "0", "--keepalive-seconds", "5", "--listen", "127.0.0.1:0", "--tls-cert", "c.pem",
                          "--tls-key", "k.pem", "--peers", "a:1", "--advertise", "a:1"], environ={})
