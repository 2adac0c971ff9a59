"""The documentation site and the README front door.

The site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken link or
anchor, a page outside the navigation or a docstring mkdocstrings cannot render fails
it. Every public name of ``metalearn`` and its subpackages (a package's ``__all__``;
for a package without one, its public modules; for an exported module, its own
``__all__``) has a docstring and appears in the API reference (the inventory,
``objects.inv``, that mkdocstrings writes for the pages it rendered). Every tutorial is
linked from the home page. The README stays a front door: short, the two set-up commands
as CI runs them, its links resolving (its code runs as pasted in tests/docs_test.py).
"""

import glob
import os
import re
import subprocess
import sys
import zlib

import griffe
import pytest

pytestmark = pytest.mark.xdist_group(__name__)  # one worker builds the site once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built strictly into a temporary folder (once per test process)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # Not --quiet: it hides the warnings from the counter that makes --strict abort.
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", os.path.join(ROOT, "mkdocs.yml"),
                           "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and not re.search(r"^WARNING\b", log, re.M), f"mkdocs build --strict failed:\n{log}"
    return out


def inventory(site_dir) -> set:
    """The object paths of the site's ``objects.inv`` (Sphinx inventory, version 2)."""
    with open(os.path.join(site_dir, "objects.inv"), "rb") as f:
        data = f.read()
    header_end = 0
    for _ in range(4):  # four plain-text header lines, then the zlib-compressed body
        header_end = data.index(b"\n", header_end) + 1
    body = zlib.decompress(data[header_end:]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines() if line.strip()}


def _packages():
    """Every package under metalearn/, by dotted path."""
    paths = glob.glob(os.path.join(ROOT, "metalearn", "**", "__init__.py"), recursive=True)
    return sorted(os.path.relpath(os.path.dirname(p), ROOT).replace(os.sep, ".")
                  for p in paths)


def public_names():
    """``[(owner, name, griffe object or None)]``: every public name of metalearn and its
    subpackages, read statically (nothing imported), as mkdocstrings reads them."""
    loader = griffe.GriffeLoader(search_paths=[ROOT])
    loader.load("metalearn")
    modules = loader.modules_collection
    found, seen = [], set()

    def visit(path):
        if path in seen:
            return
        seen.add(path)
        module = modules[path]
        if module.exports is not None:
            names = [e if isinstance(e, str) else e.name for e in module.exports]
        elif module.is_package:
            names = sorted(n for n, m in module.members.items()
                           if not n.startswith("_") and not m.is_alias and m.is_module)
        else:
            names = []  # a module without __all__ is covered by its page, not name by name
        for name in names:
            member = module.members.get(name)
            found.append((path, name, member))
            try:
                target = member.final_target if member is not None and member.is_alias else member
            except griffe.AliasResolutionError:
                continue
            if target is not None and target.is_module:
                visit(target.path)

    for package in _packages():
        visit(package)
    return found


def _docstring(member):
    try:
        docstring = member.docstring
    except griffe.AliasResolutionError as error:
        return f"<unresolved: {error}>"
    return docstring.value.strip() if docstring is not None else ""


def test_every_public_name_has_a_docstring():
    names = public_names()
    assert len(names) > 150, len(names)  # the walk found the packages' exports
    missing = [f"{owner}.{name}" for owner, name, member in names
               if member is None or not _docstring(member) or _docstring(member).startswith("<")]
    assert not missing, f"public names without a docstring (or not found): {missing}"


def test_every_public_name_is_in_the_api_reference(site):
    rendered = inventory(site)
    absent = [f"{owner}.{name}" for owner, name, _ in public_names()
              if f"{owner}.{name}" not in rendered]
    assert not absent, ("public names missing from the API reference (its pages are "
                        f"generated by mkdocs_hooks.py; is the name importable?): {absent}")
    for page in ("index.html", "api/metalearn.adapters/index.html", "results/omniglot/index.html"):
        assert os.path.exists(os.path.join(site, page)), page


def _links(path):
    with open(path) as f:
        return [link.split("#")[0] for link in _LINK.findall(f.read())]


def test_every_tutorial_is_linked_from_the_home_page():
    home = {os.path.normpath(os.path.join(DOCS, link)) for link in _links(os.path.join(DOCS, "index.md"))
            if not link.startswith("http")}
    tutorials = sorted(glob.glob(os.path.join(DOCS, "tutorials", "*.md")))
    assert tutorials
    unlinked = [os.path.relpath(t, ROOT) for t in tutorials if os.path.normpath(t) not in home]
    assert not unlinked, f"tutorials not linked from docs/index.md: {unlinked}"


def test_readme_is_a_front_door():
    with open(README) as f:
        text = f.read()
    assert len(text.splitlines()) <= 250, len(text.splitlines())
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    test_command = "pip install -e '.[test]' && python -m pytest -n 2 -q"
    pasted = re.sub(r" *\\\n *", " ", text)  # a shell joins lines ending in a backslash
    assert test_command in pasted and test_command in ci  # CI runs exactly the README's command
    assert ("pip install -e . && python -m metalearn.train "
            "--gin_file=experiments/sinusoid/maml.gin --workdir=runs/sinusoid_maml && "
            "python -m metalearn.evaluate --workdir=runs/sinusoid_maml") in pasted
    assert "mkdocs serve" in text
    broken = [link for link in _links(README) if not link.startswith("http") and link
              and not os.path.exists(os.path.join(ROOT, link))]
    assert not broken, f"README links to missing files: {broken}"

