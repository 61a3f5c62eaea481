"""Spark's Python workers run this interpreter once `tidelog.spark` is imported, so a job run from
the venv without an activated venv (examples/topic_to_parquet.py) finds tidelog in its workers."""

from __future__ import annotations

import os
import subprocess
import sys

SHOW = "import os, tidelog.spark; print(os.environ.get('PYSPARK_PYTHON'))"


def python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_importing_the_source_points_spark_workers_at_this_interpreter() -> None:
    assert python(SHOW) == sys.executable


def test_an_interpreter_the_caller_chose_is_kept() -> None:
    assert python(SHOW, PYSPARK_PYTHON="/opt/other/python") == "/opt/other/python"
