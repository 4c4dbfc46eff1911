"""The example programs: run them as scripts (``python examples/char_gpt.py``) or through
``python -m minitx train <task>``. An installed minitx carries them as ``minitx.examples``
(setup.py maps this folder there), so the ``train`` command works outside a checkout."""
