"""Test-only start-up hook: with ``P4S_SIM_CUDA_MB`` set, simulate a GPU once torch is imported.

Nothing is imported eagerly, so a runner process that never imports torch stays torch-free.
"""
import importlib.abc
import importlib.util
import os
import sys


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            import cuda_sim

            cuda_sim.install_from_env()

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("P4S_SIM_CUDA_MB"):
    sys.meta_path.insert(0, _AfterTorch())
