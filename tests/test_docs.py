"""Every code block of README.md and docs/*.md is run or checked here, so the docs cannot rot.

What happens to a fenced block depends on its language tag:

- ```python   run. A block that names "127.0.0.1:50051" runs against a real server (a ServerThread on a
              free port, whose address is put in its place); one that also passes `tls=` runs against
              a server with mutual TLS and tokens, in a folder holding ca.pem, client.pem and
              client-key.pem, with an admin token in $DBVT_TOKEN; one that calls `.snapshot()` runs
              against a server with a data directory. Any other block runs as written.
- ```sh       checked, not run. Each command line is cut at `&&`, `||`, `;` and `|`. Every `dbvt-server`
              command is parsed by the server's own argparse parser (`dbvt_server.config.parse`), with
              any `NAME=value` prefixes as its environment, and nothing is started (`dbvt-server
              new-token` by its own parser), every `dbvt-admin` command by its parser, and every
              `dbvt-bench SUBCOMMAND ...` command must answer `dbvt-bench SUBCOMMAND --help` with exit
              status 0. Other commands (python3 -m venv, pip, pytest, docker) are not run.
- ```yaml     checked: parsed, and every dbvt_* metric it names must be one a real server exports.
- ```console  shown only: neither run nor checked (docker, grpcurl, a command's output).

A fence with any other tag, or none, fails the test, so that no block escapes. Beside the blocks:
README.md stays a front door (at most 150 lines), its Quick start test command is the one .ci/run
runs, every relative link resolves, every server setting is documented, and no page sends users to
files outside the repository.
"""
from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dbvt_client import Client, DbvtError
from dbvt_server import admin, config
from dbvt_server.__main__ import new_token_parser
from security import Pki, TokenFile
from servers import NEUTRAL_DIR, ServerThread

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
RUN, CHECKED, SHOWN = {"python"}, {"sh", "yaml"}, {"console"}
SERVER_ADDRESS = "127.0.0.1:50051"
SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int       # the line of the opening fence, counted from 1
    tag: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found, opened, lines = [], None, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if opened is None:
            if stripped.startswith("```"):
                opened, indent, lines = (number, stripped[3:].strip()), len(line) - len(line.lstrip()), []
        elif stripped == "```":
            found.append(Block(page, opened[0], opened[1], "\n".join(lines) + "\n"))
            opened = None
        else:
            lines.append(line[indent:])
    assert opened is None, f"{page.name}:{opened[0]}: a fence is never closed"
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def of_tag(tags: set[str]) -> list[Block]:
    return [block for block in ALL_BLOCKS if block.tag in tags]


def test_every_block_is_run_checked_or_shown():
    untagged = [f"{block.where} ```{block.tag}" for block in ALL_BLOCKS if block.tag not in RUN | CHECKED | SHOWN]
    assert not untagged, f"fences must be tagged {sorted(RUN | CHECKED | SHOWN)}: {untagged}"
    assert of_tag(RUN) and of_tag({"sh"}) and of_tag({"yaml"})


# ---- python: run ------------------------------------------------------------------------------------

def run_python(block: Block, tmp_path: Path, monkeypatch) -> dict:
    code, server = block.code, None
    if SERVER_ADDRESS in code and "tls=" in code:
        server = secured_server(tmp_path, monkeypatch)
    elif SERVER_ADDRESS in code and ".snapshot()" in code:
        server = ServerThread(data_dir=str(tmp_path / "data"))
    elif SERVER_ADDRESS in code:
        server = ServerThread()
    if server is not None:
        code = code.replace(SERVER_ADDRESS, server.target)
    try:
        namespace: dict = {"__name__": "__docs__"}
        # Padded so that a traceback names the page's own line numbers.
        exec(compile("\n" * block.line + code, str(block.page), "exec"), namespace)
        return namespace
    finally:
        if server is not None:
            server.stop()


def secured_server(folder: Path, monkeypatch) -> ServerThread:
    """A server with mutual TLS and tokens; the block runs in `folder`, beside the PEM files it names."""
    pki = Pki(folder)
    tokens = TokenFile(folder / "tokens", ("ops", "admin", "*"))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("DBVT_TOKEN", tokens.secret["ops"])
    return ServerThread(**pki.server_settings(mutual=True), tokens=str(tokens.path))


def _readme_sdk(ns: dict) -> None:
    assert ns["r"].tick == 4
    assert ns["pairs"].tolist() == [[0, 1], [0, 7]]       # 7 is the static box at the origin


def _readme_core(ns: dict) -> None:
    assert ns["begun"].tolist() == [[0, 2], [1, 2]] and ns["ended"].tolist() == []
    assert ns["hits"].tolist() == [0, 1, 2]


def _tick_in_flight(ns: dict) -> None:
    assert ns["last"].tick == 5                             # the create, then four streamed ticks
    assert ns["last"].ended.tolist() == []


# (page, a text only that block holds) -> what its namespace must show once it has run.
EXPECTED = {
    ("README.md", 'Client("127.0.0.1:50051")'): _readme_sdk,
    ("README.md", "dbvt.Broadphase("): _readme_core,
    ("sdk.md", "following = s.submit("): _tick_in_flight,
}


def checks_for(block: Block) -> list:
    return [check for (page, marker), check in EXPECTED.items() if block.page.name == page and marker in block.code]


@pytest.mark.parametrize("block", of_tag(RUN), ids=lambda block: block.where)
def test_python_block_runs(block, tmp_path, monkeypatch):
    namespace = run_python(block, tmp_path, monkeypatch)
    for check in checks_for(block):
        check(namespace)


def test_every_expected_result_has_its_block():
    for (page, marker), check in EXPECTED.items():
        matching = [block for block in of_tag(RUN) if block.page.name == page and marker in block.code]
        assert len(matching) == 1, f"{page}: {len(matching)} python blocks hold {marker!r} ({check.__name__})"


# ---- sh: checked --------------------------------------------------------------------------------------

# ---- yaml: checked ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def exported_metrics() -> set[str]:
    """The metric and sample names of a real server's /metrics, once it has answered calls."""
    server = ServerThread(metrics_address="127.0.0.1:0")
    try:
        with Client(server.target) as client:
            client.create_world("scraped").apply(create=([1], [[0, 0, 0, 1, 1, 1]]))
            client.world("scraped").query_aabb([[0, 0, 0, 1, 1, 1]])
            with client.world("scraped").stream() as stream:
                stream.apply(move=([1], [[0, 0, 0, 2, 2, 2]]))
            with pytest.raises(DbvtError):
                client.world("nowhere").pairs()
        port = server.running.metrics_endpoint.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        server.stop()
    families = list(text_string_to_metric_families(text))
    return {family.name for family in families} | {sample.name for family in families for sample in family.samples}


@pytest.mark.parametrize("block", [block for block in ALL_BLOCKS if block.tag == "yaml"], ids=lambda b: b.where)
def test_yaml_block_parses_and_names_only_exported_metrics(block):
    yaml.safe_load(block.code)
    named = set(re.findall(r"\bdbvt_[a-z_]+", block.code)) - {"dbvt_server"}
    assert named <= exported_metrics(), f"{block.where}: no such metric: {sorted(named - exported_metrics())}"


def commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block, as argument lists."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in lexer:
            if token in SEPARATORS:
                found.append(words)
                words = []
            else:
                words.append(token)
        found.append(words)
    return [words for words in found if words]


def split_environment(words: list[str]) -> tuple[dict, list[str]]:
    environment = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, value = words[0].split("=", 1)
        environment[name] = value
        words = words[1:]
    return environment, words


def checked_commands(program: str) -> list[tuple[Block, dict, list[str]]]:
    found = []
    for block in of_tag({"sh"}):
        for words in commands(block.code):
            environment, words = split_environment(words)
            if words and words[0] == program:
                found.append((block, environment, words[1:]))
    return found


def _ids(item) -> str:
    block, environment, args = item
    return " ".join([block.where, *[f"{k}={v}" for k, v in environment.items()], *args])


@pytest.mark.parametrize("item", checked_commands("dbvt-server"), ids=_ids)
def test_dbvt_server_command_parses(item):
    block, environment, args = item
    complaint = io.StringIO()
    try:
        with contextlib.redirect_stderr(complaint), contextlib.redirect_stdout(io.StringIO()):
            if args[:1] == ["new-token"]:
                new_token_parser().parse_args(args[1:])
            else:
                config.parse(args, environ=environment)
    except SystemExit as exit:      # --help and --version exit 0; a refused argument exits 2
        assert exit.code == 0, f"{_ids(item)}: {complaint.getvalue()}"


def entry_point(script: str) -> tuple[str, str]:
    """The module and function pyproject.toml names for a console script (as `pip install .` makes it)."""
    found = re.search(rf'^{re.escape(script)}\s*=\s*"([\w.]+):(\w+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert found, f"pyproject.toml names no console script {script}"
    return found.group(1), found.group(2)


@functools.lru_cache(maxsize=None)
def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    module, function = entry_point(script)
    program = f"import sys; sys.argv[0] = {script!r}; from {module} import {function} as main; sys.exit(main())"
    # Outside the repository, so that the source tree's dbvt/ (without its compiled core) is not imported.
    return subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=120,
                          cwd=NEUTRAL_DIR)


@pytest.mark.parametrize("item", checked_commands("dbvt-bench"), ids=_ids)
def test_dbvt_bench_subcommand_answers_help(item):
    # Generic on purpose: the subcommands are being written; a stricter check parses every argument.
    block, _, args = item
    subcommand = [arg for arg in args[:1] if not arg.startswith("-")]
    shown = run_script("dbvt-bench", *subcommand, "--help")
    assert shown.returncode == 0, f"{_ids(item)}: dbvt-bench {' '.join(subcommand)} --help:\n{shown.stderr}"


@pytest.mark.parametrize("item", checked_commands("dbvt-admin"), ids=_ids)
def test_dbvt_admin_command_parses(item):
    block, _, args = item
    with contextlib.redirect_stderr(io.StringIO()) as complaint:
        try:
            admin.parser().parse_args(args)
        except SystemExit as exit:
            assert exit.code == 0, f"{_ids(item)}: {complaint.getvalue()}"


def test_the_pages_show_every_command():
    assert checked_commands("dbvt-server") and checked_commands("dbvt-bench") and checked_commands("dbvt-admin")


# ---- the pages as a whole ---------------------------------------------------------------------------

def test_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= 150


def test_quick_start_test_command_is_what_ci_runs():
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith("python3 -m venv") and "pytest" in line]
    assert len(ci) == 1, ".ci/run should run one install-and-test command line"
    shown = {line.strip() for block in blocks(README) if block.tag in CHECKED for line in block.code.splitlines()}
    assert ci[0] in shown, f"README's Quick start no longer shows what .ci/run runs: {ci[0]}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(heading) for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


@pytest.mark.parametrize("page", ["README.md", "docs/operations.md"])
def test_every_server_setting_is_documented(page):
    text = (REPO / page).read_text()
    for setting in config.SETTINGS:
        flag = "--" + setting.name.replace("_", "-")
        assert f"`{flag}`" in text and f"`{setting.env}`" in text, f"{page} does not document {flag} / {setting.env}"


def test_no_page_sends_users_outside_the_repository():
    """A user's clone holds only the repository: every path a page climbs to with `../` must
    resolve inside it, in links and in prose alike."""
    root = REPO.resolve()
    for page in PAGES:
        for path in re.findall(r"(?:\.\./)+[\w.-][\w./-]*", page.read_text()):
            target = (page.parent / path).resolve()
            assert target == root or root in target.parents, f"{page.name} points outside the repository: {path}"
