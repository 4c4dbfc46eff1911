"""Packaging: setup.cfg says everything but one thing it cannot say — that the repository's
``examples/`` folder ships inside the package as ``minitx.examples``, so that
``python -m minitx train <task>`` runs from an installed minitx anywhere while the scripts stay
where readers look for them (``python examples/char_gpt.py`` in a checkout)."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["minitx", "minitx.*"]) + ["minitx.examples"],
      package_dir={"minitx.examples": "examples"})
