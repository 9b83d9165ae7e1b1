"""The built extension shares the process's C++ runtime instead of carrying a copy of its own.

On the GPU machine the CUDA extension was once linked against libstdc++.a (the compiler named by
CXX there linked its own runtime statically): the extension NEEDED no libstdc++.so.6 and defined
`std::ostream::_M_insert<long>` and the locale facet ids itself. Two copies of the runtime keep two
sets of facet ids, so the first `os << int` inside the extension used a wrong facet: every rank died
with SIGSEGV in Communicator's constructor, before any op. setup.py now names libstdc++.so.6 on the
link line; this checks the result on whatever machine builds it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from support import import_pycomm_or_skip

# libstdc++'s own definitions an extension must import rather than define: the stream insertion of
# integers and the ids of the locale facets (static data of which exactly one copy may exist), and
# functions no header defines inline (std::locale::classic, the stream library's initializer), which
# only an archive of the runtime brings.
RUNTIME_COPIES = re.compile(
    r"^_ZNSo9_M_insertI[lmxy]EERSoT_$|^_ZNSt7num_putIcSt19ostreambuf_iterator.*2idE$"
    r"|^_ZNSt6locale7classicEv$|^_ZNSt8ios_base4InitC[12]Ev$"
)
C_LOCALE = {**os.environ, "LC_ALL": "C"}  # binutils' messages are translated


def _extension_path() -> str:
    pycomm = import_pycomm_or_skip("pytest tests/test_extension_link.py")
    return pycomm._C.__file__


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) is not installed")
    return path


def test_extension_needs_the_shared_cxx_runtime() -> None:
    dynamic = subprocess.run([_tool("readelf"), "-d", _extension_path()], capture_output=True,
                             text=True, check=True, env=C_LOCALE).stdout
    needed = re.findall(r"\(NEEDED\).*\[([^\]]+)\]", dynamic)
    assert "libstdc++.so.6" in needed, f"the extension links no shared libstdc++; it needs {needed}"


def test_extension_defines_no_copy_of_the_cxx_runtime() -> None:
    symbols = subprocess.run([_tool("nm"), "-D", "--defined-only", _extension_path()],
                             capture_output=True, text=True, check=True, env=C_LOCALE).stdout
    names = [line.split()[-1] for line in symbols.splitlines() if line.strip()]
    copies = [name for name in names if RUNTIME_COPIES.match(name)]
    assert not copies, f"the extension defines libstdc++'s own symbols (a static copy of the runtime): {copies}"
