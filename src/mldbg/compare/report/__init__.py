"""Stage 5 of a comparison: what a user or an agent is shown.

``answer.py`` shapes the result for agents (the verdict first, within a budget),
``narrow.py`` says which capture to make next, ``html.py`` writes the self-contained HTML
report, ``table.py`` the per-call time and dtype table of one capture (``module-table``).
"""
