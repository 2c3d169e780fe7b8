#!/usr/bin/env bash
# The COMDAT rule of the portable build (docs/CPU_BACKEND.md, "Kernels chosen at run time"), checked on the
# built static library:
#  1. no ISA object (*_avx512*.o, compiled with the AVX-512 flags) defines a weak symbol (nm types W, V, u):
#     an inline function or template instantiated there is emitted as a weak copy compiled for AVX-512, and
#     the linker may keep that copy for the whole program -> SIGILL on CPUs without AVX-512;
#  2. no other source file uses AVX-512 intrinsics or types (they belong in the ISA files, and in *_avx512*.h
#     headers that only ISA files include, everything in an anonymous namespace);
#  3. (portable builds) no other object contains an instruction on zmm registers.
# Usage: check-isa-objects.sh LIBALPAMAYO.a NM SOURCE_DIR [portable|native]
set -euo pipefail
lib=$1 nm=$2 src=$3 mode=${4:-portable}
fail=0

members=$(ar t "$lib")
isa_members=$(printf '%s\n' "$members" | grep -E '_avx512([_.]|$)' || true)
if [ -z "$isa_members" ]; then
  echo "check-isa-objects: no *_avx512*.o in $lib (were the ISA files renamed?)" >&2
  exit 1
fi
for m in $isa_members; do
  weak=$(ar p "$lib" "$m" > "${TMPDIR:-/tmp}/isa-check-$$.o" && "$nm" -C --defined-only "${TMPDIR:-/tmp}/isa-check-$$.o" |
         awk '$2 ~ /^[WVu]$/' || true)
  rm -f "${TMPDIR:-/tmp}/isa-check-$$.o"
  if [ -n "$weak" ]; then
    echo "FAIL: $m defines weak symbols (compiled for AVX-512, the linker may pick them for all code):" >&2
    printf '  %s\n' "$weak" >&2
    echo "  -> put them in an anonymous namespace, or call no inline function of a header there" >&2
    fail=1
  fi
done

others=$(grep -rlE '_mm512_|__m512|target\("[^"]*avx512' "$src/src" "$src/include" "$src/tools" \
         --include='*.cpp' --include='*.h' --include='*.cc' | grep -vE '_avx512([_.][^/]*)?\.(cpp|cc|h)$' || true)
if [ -n "$others" ]; then
  echo "FAIL: AVX-512 intrinsics outside the ISA files (*_avx512*.cpp):" >&2
  printf '  %s\n' $others >&2
  fail=1
fi

if [ "$mode" = portable ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && ar x "$lib")
  objdump=${OBJDUMP:-objdump}
  for o in "$tmp"/*.o; do
    name=$(basename "$o")
    printf '%s\n' "$isa_members" | grep -qxF "$name" && continue
    if "$objdump" -d --no-show-raw-insn "$o" | grep -q '%zmm'; then
      echo "FAIL: $name (not an ISA object) contains zmm instructions:" >&2
      "$objdump" -d --no-show-raw-insn "$o" | grep -m3 '%zmm' >&2
      fail=1
    fi
  done
fi

[ $fail -eq 0 ] && echo "check-isa-objects: $(printf '%s\n' $isa_members | wc -l) ISA objects without weak symbols; no AVX-512 elsewhere"
exit $fail
