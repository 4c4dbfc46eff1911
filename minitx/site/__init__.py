"""The reading site: ``python -m minitx site --out DIR`` builds a static website from minitx's own
source files — notes beside code, maths rendered at build time, live proofs recomputed at every
build, and the notebooks executed — with no network at build time or when the pages are read.

A program-level package (beside ``tour`` and ``cli``): it imports the library, never the other
way round. Its tools (Markdown, highlighting, maths, notebook execution) are the ``[docs]``
extra; the library itself stays NumPy-only.
"""
