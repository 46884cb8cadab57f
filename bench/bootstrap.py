#!/usr/bin/env python3
"""Entry point of `cirro bench`: make the benchmark's own Python environment,
then run the harness (`cirrobench`) in it.

Standard library only: it runs under the system's python3. The environment
lives in ~/.cache/cirro/bench-venv (CIRRO_BENCH_VENV overrides) and holds the
peers at the versions pinned in requirements.txt; it is rebuilt when that file
changes. DuckDB's newest release (requirements-duckdb2.txt) goes into its
directory `duckdb2` inside it. Spark (requirements-spark.txt) is added only
when a run asks for it.

    python3 bench/bootstrap.py [--setup-only] <harness arguments>
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def venv_dir() -> Path:
    default = Path(os.environ.get("HOME", "/root")) / ".cache/cirro/bench-venv"
    return Path(os.environ.get("CIRRO_BENCH_VENV", default))


def apt_install(package: str, why: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(f"cirro bench: {why}: install the Debian package {package} (apt-get install {package})")
    print(f"cirro bench: installing {package} ({why})", file=sys.stderr)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.DEVNULL)


def pip_install(venv: Path, requirements: Path) -> None:
    subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", "-r", str(requirements)],
                   check=True)
    shutil.copy(requirements, venv / requirements.name)


def installed(venv: Path, requirements: Path) -> bool:
    stamp = venv / requirements.name
    return stamp.exists() and stamp.read_bytes() == requirements.read_bytes()


def ensure_venv(spark: bool) -> Path:
    venv = venv_dir()
    requirements = HERE / "requirements.txt"
    if not installed(venv, requirements):
        if subprocess.run([sys.executable, "-c", "import ensurepip, venv"], capture_output=True).returncode != 0:
            apt_install("python3-venv", "Python's venv module is missing")
        print(f"cirro bench: creating the benchmark environment in {venv} (pinned peers, first use only)",
              file=sys.stderr)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip_install(venv, requirements)
    # DuckDB's newest release in a directory of its own: it cannot share
    # site-packages with the pinned one (same package name).
    newest, target = HERE / "requirements-duckdb2.txt", venv / "duckdb2"
    if not installed(target, newest):
        print("cirro bench: adding DuckDB's newest release beside the pinned one", file=sys.stderr)
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), "-r", str(newest)], check=True)
        shutil.copy(newest, target / newest.name)
    if spark:
        extra = HERE / "requirements-spark.txt"
        if not installed(venv, extra):
            print("cirro bench: adding pyspark to the benchmark environment", file=sys.stderr)
            pip_install(venv, extra)
        if not shutil.which("java"):
            apt_install("default-jre-headless", "Spark needs a Java runtime")
    return venv


def wants_spark(args) -> bool:
    """Whether `--peers a,b` / `--peers=a,b` names spark."""
    peers = [a.split("=", 1)[1] for a in args if a.startswith("--peers=")]
    peers += [b for a, b in zip(args, args[1:]) if a == "--peers"]
    return any("spark" in p.split(",") for p in peers)


def main() -> None:
    args = sys.argv[1:]
    setup_only = "--setup-only" in args
    args = [a for a in args if a != "--setup-only"]
    venv = ensure_venv(wants_spark(args))
    if setup_only:
        print(venv / "bin/python")
        return
    env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    python = str(venv / "bin/python")
    os.execve(python, [python, "-m", "cirrobench", *args], env)


if __name__ == "__main__":
    main()
