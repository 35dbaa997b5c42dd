"""Files shipped inside the package beside the code: the annotated settings file and the
examples (config/ of the repository, packaged as `dispatcher.share.config`) and the systemd
unit (systemd/, as `dispatcher.share.systemd`); setup.py maps them. `dispatcher config example`
prints them, so an installed wheel carries its own full settings reference."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from dispatcher.errors import DispatcherError

DEFAULT = "dispatcher.toml"
# name prefix -> (data package, the repository directory it is built from)
ROOTS = {
    "": ("dispatcher.share.config", "config"),
    "systemd/": ("dispatcher.share.systemd", "systemd"),
}


def _root(package: str, folder: str) -> Traversable:
    try:
        return resources.files(package)
    except ModuleNotFoundError:
        # an editable install (pip install -e .): setuptools' finder maps `dispatcher` to the
        # source tree but not the mapped data packages, which sit at the top of that tree
        return Path(__file__).resolve().parents[2] / folder


def _walk(node: Traversable, prefix: str) -> dict[str, Traversable]:
    found: dict[str, Traversable] = {}
    for child in node.iterdir():
        if child.is_dir() and child.name != "__pycache__":
            found |= _walk(child, f"{prefix}{child.name}/")
        elif child.is_file() and not child.name.endswith((".py", ".pyc")):
            found[prefix + child.name] = child
    return found


def shipped() -> dict[str, Traversable]:
    """Every shipped file by its name, e.g. `dispatcher.toml`, `systemd/dispatcher.service`."""
    found: dict[str, Traversable] = {}
    for prefix, (package, folder) in ROOTS.items():
        found |= _walk(_root(package, folder), prefix)
    return dict(sorted(found.items()))


def example(name: str = DEFAULT) -> str:
    """The text of one shipped file; an unknown name is refused with the list of known ones."""
    files = shipped()
    if name not in files:
        known = ", ".join(files)
        raise DispatcherError(f"no shipped example named {name!r}; choose one of: {known}")
    return files[name].read_text(encoding="utf-8")
