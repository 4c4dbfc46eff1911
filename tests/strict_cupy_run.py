"""Run a script or a module with the strict CuPy stand-in installed as ``cupy``.

    python tests/strict_cupy_run.py examples/seq2seq.py --quick --backend cupy
    python tests/strict_cupy_run.py -m minitx --backend cupy

The programs then meet "device" arrays that refuse every host mix, as on a GPU
(``tests/strict_cupy.py``); ``tests/gpu/test_cupy_backend_programs.py`` runs every example, the
tour, ``bench`` and ``train`` this way.
"""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strict_cupy  # noqa: E402

strict_cupy.install()
if len(sys.argv) > 2 and sys.argv[1] == "-m":
    module = sys.argv[2]
    sys.argv = [module] + sys.argv[3:]
    sys.path.insert(0, os.getcwd())                  # as `python -m` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    path = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(path, run_name="__main__")
