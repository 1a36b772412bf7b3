"""The installed package is the one namespace the README promises: every sub-package of ddsim/ and
every mapped top-level folder is listed for setuptools (an unlisted one works in the editable
install and is missing from a wheel), and nothing else installs at the top level."""
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_under_the_ddsim_namespace():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    assert all(p == "ddsim" or p.startswith("ddsim.") for p in listed)
    found = set()
    for name, folder in dirs.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found == listed, (sorted(found - listed), sorted(listed - found))
