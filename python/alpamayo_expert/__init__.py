"""Python helpers for the Alpamayo action-expert engine: context, noise and checkpoint files."""
from importlib import import_module

# Lazy exports, so `python -m alpamayo_expert.context` does not import the module twice.
_EXPORTS = {
    "Context": "context", "cache_layers": "context", "read_context": "context", "write_context": "context",
    "read_noise": "noise", "write_noise": "noise", "write_checkpoint": "checkpoint",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
