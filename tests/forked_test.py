"""tests/forked.py: a forked process sees what a fresh interpreter started with the same
command sees, and is killed, waited for and read as one."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests import forked

_REPORT = r"""
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__,
                  "path": sys.path[:3], "env": os.environ.get("FORKED_TEST"),
                  "own_session": os.getsid(0) == os.getpid(),
                  "metalearn": any(m.split(".")[0] == "metalearn" for m in sys.modules)}))
sys.stderr.write("to stderr\n")
sys.exit(int(os.environ.get("FORKED_EXIT", "0")))
"""


def _both(tmp_path, command, **kwargs):
    env = dict(os.environ, FORKED_TEST="given", FORKED_EXIT="3",
               PYTHONPATH=os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    found = []
    for start in (subprocess.run, forked.run):
        out = start(command, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                    timeout=120, **kwargs)
        found.append((out.returncode, json.loads(out.stdout), out.stderr))
    return found


@pytest.mark.parametrize("kind", ["-c", "-m", "script"])
def test_a_forked_process_sees_what_a_fresh_one_sees(tmp_path, kind):
    (tmp_path / "report_module.py").write_text(_REPORT)
    what = {"-c": ["-c", _REPORT], "-m": ["-m", "report_module"],
            "script": [str(tmp_path / "report_module.py")]}[kind]
    fresh, fork = _both(tmp_path, [sys.executable, *what, "x", "--y=1"],
                        start_new_session=True)
    assert fork == fresh
    assert fresh[0] == 3 and fresh[1]["env"] == "given" and fresh[1]["own_session"]
    assert fresh[1]["argv"] == ["x", "--y=1"] and fresh[2] == "to stderr\n"
    assert not fork[1]["metalearn"]


def test_a_forked_process_is_killed_and_its_status_read_as_popen_s():
    process = forked.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                            "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "up\n"
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    process.stdout.close()


def test_other_commands_and_interpreter_options_start_fresh_processes():
    for command in (["true"], [sys.executable, "-X", "importtime", "-c", "pass"]):
        process = forked.Popen(command, stderr=subprocess.DEVNULL)
        assert isinstance(process, subprocess.Popen)
        assert process.wait(timeout=120) == 0
