"""The package list, which pyproject.toml cannot express: every `dispatcher*` package as found,
plus data packages mapped from two top-level directories that stay where operators and other
tools look for them. config/ (the annotated settings file, examples, Prometheus and Grafana
files, sidecar manifests) ships as `dispatcher.share.config` and systemd/ as
`dispatcher.share.systemd`, so `dispatcher config example` can print them from an installed
wheel. Their files reach the wheel through MANIFEST.in (`graft config`, `graft systemd`):
pyproject.toml's package-data replaces setup.py's, and include-package-data takes what the
manifest lists. Everything else about the build is in pyproject.toml."""

from pathlib import Path

from setuptools import find_packages, setup

SHARED = {"dispatcher.share.config": Path("config"), "dispatcher.share.systemd": Path("systemd")}


def data_packages() -> dict[str, str]:
    """Each shared directory and its subdirectories as a package name -> its directory."""
    found = {}
    for package, top in SHARED.items():
        for folder in [top, *sorted(p for p in top.rglob("*") if p.is_dir())]:
            if folder.name != "__pycache__":
                dotted = ".".join(folder.relative_to(top).parts)
                found[f"{package}.{dotted}" if dotted else package] = str(folder)
    return found


DATA = data_packages()

setup(
    packages=[*find_packages(include=["dispatcher*"]), *DATA],
    package_dir=DATA,
)
