#!/usr/bin/env bash
# Packs binaries built on this machine for a run on a GPU machine that has the NVIDIA
# driver and the CUDA toolkit (cuBLAS) but not our Debian libraries (jansson, libyaml,
# OpenBLAS, PCRE2, utf8proc, Open MPI, ...): the given files, stripped, at their paths
# relative to the repo root, plus every shared library they load except glibc's and the
# CUDA driver's and toolkit's own, into .gpu-lib/ inside one .tar.xz.
#
#   scripts/gpu-bundle.sh OUT.tar.xz FILE...
#
# On the GPU machine, from the repo root:
#   tar xJf OUT.tar.xz && export LD_LIBRARY_PATH=$PWD/.gpu-lib
# The binaries keep their rpath to /usr/local/cuda/lib64 for cuBLAS and the CUDA runtime.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT.tar.xz FILE..." >&2; exit 2; }
out=$1; shift
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/.gpu-lib"
# glibc, the dynamic loader and the CUDA driver/toolkit come from the GPU machine.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcublas(Lt)?\.so|libcudart\.so|libnccl\.so)'
for f in "$@"; do
  mkdir -p "$stage/$(dirname "$f")"
  if file -b "$f" | grep -q ELF; then
    strip -o "$stage/$f" "$f"
    ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
      if ! [[ $name =~ $skip ]] && [ ! -e "$stage/.gpu-lib/$name" ]; then
        cp -L "$path" "$stage/.gpu-lib/$name"
      fi
    done
  else
    cp -a "$f" "$stage/$f"
  fi
done
tar -C "$stage" -cJf "$out" .
echo "$out: $(du -h "$out" | cut -f1), $(ls "$stage/.gpu-lib" | wc -l) libraries" >&2
