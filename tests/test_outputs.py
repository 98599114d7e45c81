"""What commands write: exports replaced in one step (a crash at the swap leaves a loadable one),
and directory locks."""
import json
import shutil
import subprocess
import sys

import pytest

from cll_scale.core.outputs import BusyError, DirLock
from cll_scale.model.export import load_export
from tests.conftest import ROOT

REWRITE = """
import sys
from cll_scale.model.export import load_export, write_export
model, manifest = load_export(sys.argv[1])
src = sys.argv[1]
write_export(sys.argv[2], model.state_dict(), model.cfg, src, {"step": 12345})
"""


@pytest.mark.integration
def test_a_process_killed_at_the_export_swap_leaves_a_loadable_export(tiny_export, tmp_path):
    out = tmp_path / "export"
    shutil.copytree(tiny_export, out)
    old_step = json.loads((out / "export.json").read_text()).get("step")
    res = subprocess.run([sys.executable, "-c", REWRITE, str(tiny_export), str(out)], cwd=ROOT,
                         env={"CLL_FAULT": "kill_at_swap", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 137, res.stderr[-2000:]
    load_export(out)                                  # checks every file's sha256
    assert json.loads((out / "export.json").read_text())["step"] == 12345 != old_step
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".export.tmp-")]
    assert len(leftovers) == 1                        # the old export, left by the killed process
    res = subprocess.run([sys.executable, "-c", REWRITE, str(tiny_export), str(out)], cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]     # a later write cleans up


def test_directory_lock_names_its_holder_and_is_released(tmp_path):
    first = DirLock(tmp_path / "run", "training run").acquire()
    with pytest.raises(BusyError, match=r"in use by pid \d+ on host .+, since "):
        DirLock(tmp_path / "run", "training run").acquire()
    first.release()
    DirLock(tmp_path / "run", "training run").acquire().release()
