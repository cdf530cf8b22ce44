"""MkDocs hook: the Sphinx roles of snntrain's docstrings (``:class:`~snntrain.nn.LIF```) shown as code.

mkdocstrings renders the docstrings as Google style; a role's target then arrives as ``:class:<code>...</code>``.
This drops the role and, for a ``~`` target, keeps the last component, as Sphinx shows it.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):<code>(~?)([^<]+)</code>")


def _short(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs) -> str:
    return ROLE.sub(_short, html)
