#!/usr/bin/env bash
# The GPU code embedded in a built program is what CMAKE_CUDA_ARCHITECTURES asked for: machine
# code (cuobjdump --list-elf) for every "N-real" or plain "N" entry, PTX (--list-ptx) for every
# "N-virtual" or plain "N", nothing else; with CUTLASS, its kernels only as sm_90a machine code.
#   tests/check_cuda_archs.sh PROGRAM "80-real,90a-real,120-virtual" CUTLASS(ON|OFF) [CUOBJDUMP]
# Exit 77 (ctest: skipped) when there is no cuobjdump (scripts/fetch_cuobjdump.sh fetches it).
set -euo pipefail
program=$1 archs=$2 cutlass=$3 tool=${4:-}
[ -n "$tool" ] && [ -x "$tool" ] || tool=$(command -v cuobjdump || true)
if [ -z "$tool" ]; then
  echo "SKIPPED: no cuobjdump (run scripts/setup.sh)"; exit 77
fi
want_elf=() want_ptx=()
IFS=';,' read -r -a items <<< "$archs"
for item in "${items[@]}"; do
  case "$item" in
    *-real) want_elf+=("sm_${item%-real}") ;;
    *-virtual) want_ptx+=("sm_${item%-virtual}") ;;
    all|all-major|native) echo "SKIPPED: CMAKE_CUDA_ARCHITECTURES=$archs lists no fixed set"; exit 77 ;;
    *) want_elf+=("sm_$item") want_ptx+=("sm_$item") ;;
  esac
done
sorted() { printf '%s\n' "$@" | sed '/^$/d' | sort -u | tr '\n' ' '; }
# "ELF file    1: zimage.1.sm_90a.cubin" -> sm_90a; "PTX file 1: zimage.1.sm_120.ptx" -> sm_120
got_elf=$("$tool" --list-elf "$program" 2>/dev/null | sed -n 's/.*\.\(sm_[0-9a-z]*\)\.cubin$/\1/p' | sort -u | tr '\n' ' ')
got_ptx=$("$tool" --list-ptx "$program" 2>/dev/null | sed -n 's/.*\.\(sm_[0-9a-z]*\)\.ptx$/\1/p' | sort -u | tr '\n' ' ')
echo "machine code: $got_elf(expected $(sorted "${want_elf[@]}"))"
echo "PTX:          $got_ptx(expected $(sorted "${want_ptx[@]}"))"
status=0
[ "$got_elf" = "$(sorted "${want_elf[@]}")" ] || { echo "FAIL: machine code differs"; status=1; }
[ "$got_ptx" = "$(sorted "${want_ptx[@]}")" ] || { echo "FAIL: PTX differs"; status=1; }
if [ "$cutlass" = ON ]; then
  # -res-usage prints "arch = sm_XX" before each cubin's "Function <mangled name>:" lines.
  cutlass_archs=$("$tool" -res-usage "$program" 2>/dev/null |
    awk '/^arch = /{arch=$3} /Function .*cutlass/{print arch}' | sort -u | tr '\n' ' ')
  echo "CUTLASS kernels: $cutlass_archs(expected sm_90a)"
  [ "$cutlass_archs" = "sm_90a " ] || { echo "FAIL: CUTLASS kernels outside sm_90a"; status=1; }
fi
exit $status
