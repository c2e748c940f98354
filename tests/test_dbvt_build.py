"""The built core keeps its fetches ahead. GCC counts a prefetch as free of side effects, so a
helper that only fetches ahead is pure to it, and its call is deleted before it can be inlined,
unless the prefetch macro gives it a side effect (dbvt/_core.pxd)."""
import platform
import re
import shutil
import subprocess

import pytest

import dbvt._broadphase


def function_listing(library: str, name: str) -> str:
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library], capture_output=True, text=True,
                             check=True).stdout
    return next(part for part in re.split(r"\n(?=[0-9a-f]+ <)", listing) if f"{name}>:" in part.split("\n", 1)[0])


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("objdump") is None,
                    reason="reads x86-64 machine code with objdump")
def test_the_updates_fetch_ahead_helpers_are_compiled_in():
    # update()'s stages fetch ahead in six places: a moved proxy's list header, its entries and its
    # partners (prefetch_partners), the next moving sensor's entries and budgets (prefetch_sensor_list),
    # and that sensor's list header. With the helpers deleted, two were left.
    track = function_listing(dbvt._broadphase.__file__, "Broadphase__track")
    assert track.count("prefetcht0") >= 6
