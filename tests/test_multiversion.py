"""The AVX2 clones of the core's hot loops (csrc/core/codecs/multiversion.h) run AVX2 code: the loops
a clone calls must be inlined into it, not left as baseline functions it calls, which would run the
work with SSE on every CPU. Read off the built extension's machine code (x86-64 GCC builds only)."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CLONE = "[clone .arch_x86_64_v3]"


def _extension() -> Path:
    import pycomm._C

    return Path(pycomm._C.__file__)


def _clones(so: Path) -> list[tuple[str, int, int]]:
    """(name, start, end) of every AVX2 clone defined in `so`."""
    out = subprocess.run(["nm", "-C", "--defined-only", "-S", str(so)], capture_output=True, text=True, check=True)
    clones = []
    for line in out.stdout.splitlines():
        parts = line.split(maxsplit=3)
        # A clone's split-off parts ("[clone .arch_x86_64_v3] [clone .part.0]") are its code too.
        if len(parts) == 4 and CLONE in parts[3] and not parts[3].endswith("[clone .cold]"):
            start = int(parts[0], 16)
            clones.append((parts[3], start, start + int(parts[1], 16)))
    return clones


def _targets(so: Path, start: int, end: int) -> set[str]:
    """The functions that the code in [start, end) calls or jumps to, demangled."""
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", f"--start-address={start}",
                          f"--stop-address={end}", str(so)], capture_output=True, text=True, check=True)
    targets = set()
    # call/jmp, or callq/jmpq as older binutils print them.
    for match in re.finditer(r"\b(?:call|jmp)q?\s+[0-9a-f]+ <(.+)>$", out.stdout, re.MULTILINE):
        targets.add(re.sub(r"\+0x[0-9a-f]+$", "", match.group(1)))
    return targets


def test_avx2_clones_call_no_baseline_loops() -> None:
    if platform.machine() != "x86_64" or not all(shutil.which(tool) for tool in ("nm", "objdump", "readelf")):
        pytest.skip("needs an x86-64 build and binutils (nm, objdump, readelf)")
    so = _extension()
    clones = _clones(so)
    if not clones:
        # GCC builds clone (multiversion.h); one that has none lost them, and that is a failure. Its
        # .comment names the compilers of its objects (GCC's runtime objects in a clang build too).
        comment = subprocess.run(["readelf", "-p", ".comment", str(so)], capture_output=True, text=True).stdout
        assert "clang" in comment.lower(), "a GCC build of the extension has no AVX2 clones"
        pytest.skip("this build has no AVX2 clones (a clang build)")
    names = {name for name, _, _ in clones}
    # The reductions are what every all-reduce runs: their clones must be among those checked.
    assert any("codecs::reduceInto(" in n for n in names) and any("codecs::reduceMany(" in n for n in names), names
    baseline_calls = {}
    for name, start, end in clones:
        own = name[: name.index(CLONE)].strip()
        called = {t for t in _targets(so, start, end)
                  if "pycomm::codecs::" in t and CLONE not in t and "@plt" not in t and not t.startswith(own)}
        if called:
            baseline_calls[name] = sorted(called)
    assert not baseline_calls, "AVX2 clones that call baseline (SSE) loops:\n" + "\n".join(
        f"{k}\n    -> " + "\n    -> ".join(v) for k, v in baseline_calls.items())
