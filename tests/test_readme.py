"""README's SDK examples run as written (the first against a real server), so the front page cannot rot."""
import re
from pathlib import Path

from servers import ServerThread

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_sdk_example_runs_against_a_real_server():
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert 'Client("127.0.0.1:50051")' in code
    server = ServerThread()
    try:
        namespace: dict = {}
        exec(compile(code.replace("127.0.0.1:50051", server.target), str(README), "exec"), namespace)
        assert namespace["r"].tick == 4
        assert namespace["pairs"].tolist() == [[0, 1], [0, 7]]     # 7 is the static box at the origin
    finally:
        server.stop()


def test_readme_tick_in_flight_example_runs():
    code = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[1]
    assert "submit(" in code and "Client.local()" in code
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["last"].tick == 5                          # the create, then four streamed ticks
    assert namespace["last"].ended.tolist() == []
