"""The one compiled part: commitlog/_speedups.c, the per-record loops of the record-batch path.

Optional: where no C compiler or Python headers exist the build skips it and tidelog runs the
same loops in Python (commitlog/speedups.py chooses; the tests run both). Everything else about
the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tidelog.commitlog._speedups",
            sources=["commitlog/_speedups.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
