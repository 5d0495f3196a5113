"""The OpenMP wait policy is passive for llama.cpp's load only, and never overrides the user."""

from __future__ import annotations

import subprocess
import sys

import pytest

from host.accuracy import llama_load


def test_environment_is_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("llama_cpp")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    llama_load.import_llama_cpp()
    import os

    assert "OMP_WAIT_POLICY" not in os.environ  # subprocesses keep the user's environment
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    llama_load.import_llama_cpp()
    assert os.environ["OMP_WAIT_POLICY"] == "active"


def test_the_policy_is_set_while_the_library_loads() -> None:
    # a fresh interpreter: a stand-in llama_cpp module records the environment it was
    # imported under, as libgomp reads it when the library loads
    code = (
        "import os, sys, types\n"
        "class Finder:\n"
        "    def find_module(self, name, path=None):\n"
        "        return self if name == 'llama_cpp' else None\n"
        "import importlib.abc, importlib.machinery\n"
        "class Loader(importlib.abc.Loader):\n"
        "    def create_module(self, spec): return None\n"
        "    def exec_module(self, m): m.seen = os.environ.get('OMP_WAIT_POLICY')\n"
        "class Meta(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'llama_cpp':\n"
        "            return importlib.machinery.ModuleSpec(name, Loader())\n"
        "sys.meta_path.insert(0, Meta())\n"
        "from host.accuracy.llama_load import import_llama_cpp\n"
        "print(import_llama_cpp().seen, os.environ.get('OMP_WAIT_POLICY'))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == ["passive", "None"]
