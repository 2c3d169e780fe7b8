# Sourced by scripts/setup.sh and scripts/test.sh (bash): compiles go through ccache where it is installed.
# test.sh's reference-only build and `pip install .` compile most of the Release build's sources again: with
# ccache those stages took 38 s instead of 142 and 24 s instead of 163 (AMD EPYC Zen 3, 2 cores; docs/TESTING.md).
# ccache's hash includes the compiler's name, so every build names it the same way (cc and c++ unless CC and CXX
# say otherwise). A launcher already set in the environment is kept.
export CC="${CC:-cc}" CXX="${CXX:-c++}"
if command -v ccache >/dev/null; then
  for _lang in C CXX CUDA; do
    _var="CMAKE_${_lang}_COMPILER_LAUNCHER"
    [ -n "${!_var+x}" ] || export "$_var=ccache"
  done
  unset _lang _var
fi
