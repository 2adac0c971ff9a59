"""MkDocs hooks for the documentation site (mkdocs.yml, ``hooks:``).

The API reference is generated from the code at every build: one page per package of
``metalearn`` (found on disk, read statically with griffe, nothing imported), holding a
mkdocstrings directive for the package (its ``__all__``) and one for each module it
exports (or, for a package without ``__all__``, each public module), and an index of
the pages with each package's first docstring line. A new package gets its page and its
``nav`` entry (under "API") without an edit here.

The docstrings cross-reference in reStructuredText roles (``:class:`Learner```), which
Markdown renders as the role's name before a code span; the pages show the code span
alone (``~a.b.C`` as ``C``, as Sphinx shows it).
"""

import glob
import os
import re

import griffe
from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "metalearn"
EXTRA_MODULES = ("metalearn.layers", "metalearn.statistics")  # documented, not exported
_ROLE = re.compile(r":(?:py:)?(?:attr|class|data|exc|func|meth|mod|obj|const):<code>"
                   r"(?:~[\w.]*?(\w+(?:\(\))?)</code>)?")


def _first_line(obj) -> str:
    docstring = obj.docstring.value.strip() if obj.docstring is not None else ""
    return docstring.split("\n\n")[0].replace("\n", " ")


def api_pages(root: str = ROOT):
    """``[(page path under docs/, title, Markdown)]``: the API reference, index first."""
    loader = griffe.GriffeLoader(search_paths=[root])
    loader.load(PACKAGE)
    modules = loader.modules_collection
    inits = glob.glob(os.path.join(root, PACKAGE, "**", "__init__.py"), recursive=True)
    packages = sorted(os.path.relpath(os.path.dirname(p), root).replace(os.sep, ".")
                      for p in inits)
    packages = [p for p in packages if not any(part.startswith("_") for part in p.split("."))]
    exported = []  # modules (not packages) a package exports: their own page when top-level
    pages = []
    for path in packages:
        package = modules[path]
        if package.exports is not None:
            names = [e if isinstance(e, str) else e.name for e in package.exports]
            parts = []
            for name in names:
                member = package.members.get(name)
                try:
                    target = member.final_target if member is not None and member.is_alias else member
                except griffe.AliasResolutionError:
                    continue
                if target is not None and target.is_module and target.path not in packages:
                    parts.append(target.path)
        else:
            parts = sorted(m.path for n, m in package.members.items()
                           if not n.startswith("_") and not m.is_alias and m.is_module)
        if path == PACKAGE:  # metalearn's exported modules get pages of their own
            exported, parts = parts, []
        directives = "\n\n".join(f"::: {p}" for p in [path] + parts)
        pages.append((path, f"# {path}\n\n{directives}\n"))
    for path in sorted(set(exported) | set(EXTRA_MODULES)):
        pages.append((path, f"# {path}\n\n::: {path}\n"))
    pages.sort()
    rows = "\n".join(f"| [{path}]({_file(path)}) | {_first_line(modules[path])} |"
                     for path, _ in pages)
    index = ("# API reference\n\nGenerated from the docstrings of the code by "
             "[mkdocstrings](https://mkdocstrings.github.io/): one page per package (its "
             "`__all__`, and each module it exports; a package without `__all__`: each "
             "public module) and per exported module. `tests/site_test.py` builds the site "
             "strictly and fails when a public name has no docstring or is missing here.\n\n"
             "| page | what it holds |\n| --- | --- |\n" + rows + "\n")
    return [("api/index.md", "Overview", index)] + [
        (f"api/{_file(path)}", path, text) for path, text in pages]


def _file(path: str) -> str:
    return path + ".md"


_PAGES = []


def on_config(config):
    """Fills the "API" section of the navigation with the generated pages."""
    pages = _PAGES[:] = api_pages()

    def fill(items):
        for item in items:
            if isinstance(item, dict):
                for key, value in item.items():
                    if key == "API":
                        item[key] = [{title: path} for path, title, _ in pages]
                    elif isinstance(value, list):
                        fill(value)
    fill(config["nav"])
    return config


def on_files(files, config):
    """Adds the generated API pages to the site's files."""
    for path, _, text in _PAGES:
        files.append(File.generated(config, path, content=text))
    return files


def on_page_content(html, page, config, files):
    """Drops the reStructuredText role names left in front of code spans."""
    return _ROLE.sub(lambda m: f"<code>{m.group(1)}</code>" if m.group(1) else "<code>", html)
