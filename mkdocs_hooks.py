"""MkDocs hooks for the documentation site (mkdocs.yml, ``hooks:``).

The docstrings cross-reference in reStructuredText roles (``:class:`Learner```), which
Markdown renders as the role's name before a code span; the page shows the code span
alone (``~a.b.C`` as ``C``, as Sphinx shows it).
"""

import re

_ROLE = re.compile(r":(?:py:)?(?:attr|class|data|exc|func|meth|mod|obj|const):<code>(?:~[\w.]*?(\w+(?:\(\))?)</code>)?")


def on_page_content(html, page, config, files):
    """Drops the reStructuredText role names left in front of code spans."""
    return _ROLE.sub(lambda m: f"<code>{m.group(1)}</code>" if m.group(1) else "<code>", html)
