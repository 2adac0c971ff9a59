"""The files a run is read from: a gin file or a workdir's config.gin with a byte that is not
UTF-8 is named (file, line, column and the includes that led there), and ``evaluate`` or
``restore`` of a workdir that is not a run names the workdir."""

import gin
import pytest

from metalearn.runs.workdir import Workdir
from metalearn.training import parse_config

from tests.run_fixtures import saved_run as saved_checkpoint


def saved_run(folder) -> str:
    """A workdir with config.gin and one checkpoint (step 1), no training."""
    saved_checkpoint(folder)
    gin.clear_config()
    return str(folder)


# --- gin and flags -----------------------------------------------------------------


def test_a_non_utf8_byte_in_a_gin_file_is_named(tmp_path):
    included = tmp_path / "included.gin"
    included.write_bytes(b"Loop.num_steps = 2\n# caf\xe9\n")
    main = tmp_path / "main.gin"
    main.write_text(f"include 'experiments/sinusoid/maml.gin'\ninclude '{included}'\n")
    with pytest.raises(SyntaxError) as info:
        parse_config([str(main)])
    message = str(info.value)
    assert f'bad gin file "{included}", line 2, column 6: byte 0xe9 is not UTF-8' in message
    assert f'included from "{main}", line 2' in message


def test_a_non_utf8_byte_in_a_workdir_s_config_is_named(tmp_path):
    from metalearn.training import restore
    workdir = saved_run(tmp_path / "run")
    with open(Workdir(workdir).config, "ab") as f:
        f.write(b"# \xff\n")
    with pytest.raises(SyntaxError, match=f'bad gin file "{Workdir(workdir).config}", '
                       "line [0-9]+, column 3: byte 0xff"):
        restore(workdir)


@pytest.mark.parametrize("entry", ["evaluate", "restore"])
@pytest.mark.parametrize("kind", ["file", "below a file", "missing", "not a run"])
def test_evaluate_and_restore_name_a_workdir_that_is_not_a_run(tmp_path, kind, entry):
    from metalearn import evaluate, restore
    call = {"evaluate": evaluate.run, "restore": restore}[entry]
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    workdir = {"file": "afile", "below a file": "afile/run", "missing": "nothing",
               "not a run": "folder"}[kind]
    error = NotADirectoryError if kind in ("file", "below a file") else FileNotFoundError
    with pytest.raises(error, match=f"workdir '{tmp_path / workdir}' "):
        call(str(tmp_path / workdir))
    assert not (tmp_path / "nothing").exists()  # the output's folder was not made
