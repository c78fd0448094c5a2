"""A pytest plugin for llama.cpp's server tests run against ferry: the model presets are never downloaded (the
shim maps them to local files), so ServerPreset.load_all does nothing, and utils.py's `wget` import (used
only for those downloads) is satisfied by an empty module when the package is absent. The module is imported
before the tests' conftest.py, which imports utils.py."""
import sys
import types

try:
    import wget  # noqa: F401
except ImportError:
    sys.modules["wget"] = types.ModuleType("wget")


def pytest_configure(config):
    import utils

    utils.ServerPreset.load_all = staticmethod(lambda: None)
