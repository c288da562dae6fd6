"""Shared fixtures for end-to-end tests: the built `mlfs` binary and examples."""
import json
import os
import subprocess
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MLFS = ROOT / os.environ.get("BUILD", "build") / "mlfs"
EXAMPLE = ROOT / "examples" / "gpt-tiny"


def run_mlfs(*args, check=True):
    """Runs `mlfs args...`; returns the CompletedProcess (text)."""
    p = subprocess.run([str(MLFS), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"mlfs {' '.join(map(str, args))} failed: {p.stderr}")
    return p


@pytest.fixture
def write_json(tmp_path):
    def write(name, obj):
        path = tmp_path / name
        path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        return path
    return write
