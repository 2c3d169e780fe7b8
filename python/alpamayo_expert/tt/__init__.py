"""The action expert as TT-Lang kernels for Tenstorrent Blackhole (docs/TT_BACKEND.md).

Backends: "tt-sim" runs the operations in tt-lang-sim, Tenstorrent's functional simulator (pip install
'alpamayo-expert[tt-sim]'); "tt" on a Blackhole through tt-lang (pip install 'alpamayo-expert[tt]'), refused
with a clear message where there is none. Nothing of this package has run on a chip.
"""
from .expert import BLACKHOLE_GRID, CACHE_FORMATS, WEIGHT_FORMATS, TTExpert, quantize_weight, round_bf16
from ._runtime import BACKENDS

__all__ = ["BACKENDS", "BLACKHOLE_GRID", "CACHE_FORMATS", "WEIGHT_FORMATS", "TTExpert", "quantize_weight",
           "round_bf16"]
