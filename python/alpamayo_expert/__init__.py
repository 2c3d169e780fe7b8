"""The Alpamayo action-expert engine from Python, and helpers for its files.

Engine (the native module, built by `pip install .`): Model, Context, Session, SampleResult, backends,
backend_formats; Error and one subclass per kind of failure (errors.py);
sample_trajectories (the expert stage of the release's VLM rollout). Files: write_context /
write_rollout_context / read_context (context files), write_noise / read_noise, write_checkpoint.
"""
from importlib import import_module
from pkgutil import extend_path

# A source checkout on PYTHONPATH (python/) finds the native module of an installed copy, or of a CMake build
# directory on the path (build/python), next to its own pure-Python modules.
__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"

# Lazy exports: `import alpamayo_expert` needs neither torch nor the native module until a name is used.
_EXPORTS = {
    "Model": ("engine", "Model"), "Context": ("engine", "Context"), "Session": ("engine", "Session"),
    "SampleResult": ("engine", "SampleResult"), "backends": ("engine", "backends"),
    "backend_formats": ("engine", "backend_formats"),
    **{name: ("errors", name) for name in ("Error", "InvalidArgumentError", "FormatError", "FileIOError",
                                           "UnsupportedError", "OutOfMemoryError", "NonFiniteError",
                                           "InvalidStateError", "InternalError")},
    "sample_trajectories": ("rollout", "sample_trajectories"), "rollout_layout": ("rollout", "rollout_layout"),
    "rollout_context": ("rollout", "rollout_context"), "find_eos_offset": ("rollout", "find_eos_offset"),
    "ContextFile": ("context", "Context"), "cache_layers": ("context", "cache_layers"),
    "read_context": ("context", "read_context"), "write_context": ("context", "write_context"),
    "write_rollout_context": ("context", "write_rollout_context"),
    "read_noise": ("noise", "read_noise"), "write_noise": ("noise", "write_noise"),
    "write_checkpoint": ("checkpoint", "write_checkpoint"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
