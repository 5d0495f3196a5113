"""libgomp's wait (passive after a 300-iteration spin) is set for llama.cpp's load only, and
never overrides a wait the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from host.accuracy import llama_load

# the measured choice (host/accuracy/llama_load.py's table), written out here
EXPECTED = {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "300"}


def test_environment_is_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("llama_cpp")
    for name in EXPECTED:
        monkeypatch.delenv(name, raising=False)
    llama_load.import_llama_cpp()
    assert not set(EXPECTED) & set(os.environ)  # subprocesses keep the user's environment
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    llama_load.import_llama_cpp()
    assert os.environ["OMP_WAIT_POLICY"] == "active"
    assert "GOMP_SPINCOUNT" not in os.environ


# a fresh interpreter: a stand-in llama_cpp module records the environment it was imported
# under, as libgomp reads it when the library loads
_PROBE = (
    "import os, sys\n"
    "import importlib.abc, importlib.machinery\n"
    "class Loader(importlib.abc.Loader):\n"
    "    def create_module(self, spec): return None\n"
    "    def exec_module(self, m):\n"
    "        m.seen = [os.environ.get(k, '-') for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')]\n"
    "class Meta(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name == 'llama_cpp':\n"
    "            return importlib.machinery.ModuleSpec(name, Loader())\n"
    "sys.meta_path.insert(0, Meta())\n"
    "from host.accuracy.llama_load import import_llama_cpp\n"
    "after = [os.environ.get(k, '-') for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')]\n"
    "print(*import_llama_cpp().seen, *after)\n"
)


def _probe(**user: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in EXPECTED} | user
    return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          env=env, check=True).stdout.split()


def test_the_wait_is_set_while_the_library_loads() -> None:
    assert _probe() == ["passive", "300", "-", "-"]


@pytest.mark.parametrize("user", [{"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "5000"}])
def test_a_wait_the_user_chose_is_kept(user: dict[str, str]) -> None:
    seen = dict(zip(EXPECTED, _probe(**user)[:2], strict=True))
    assert seen == {k: user.get(k, "-") for k in EXPECTED}
