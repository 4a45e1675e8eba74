#!/usr/bin/env bash
# Builds a causal-conv1d wheel for one GPU architecture, Python and torch, on a machine with nvcc, for a GPU machine
# that cannot fetch or compile it (bench e2e: transformers' Qwen3.5 takes its short convolutions from it, else it runs
# its PyTorch reference). PyPI has only the sdist, whose build downloads a prebuilt wheel from GitHub or compiles
# every architecture; this one compiles only ARCH.
#   tools/build_causal_conv1d.sh OUT_DIR        (env: PYTHON=python3.12 TORCH=2.11.0 ARCH=90 VERSION=1.7.0 JOBS=2)
# On the GPU machine: pip install --no-deps OUT_DIR/causal_conv1d-*.whl (or --target a folder on PYTHONPATH).
set -euo pipefail
out=${1:?usage: tools/build_causal_conv1d.sh OUT_DIR}
py=${PYTHON:-python3.12}; torch_version=${TORCH:-2.11.0}; arch=${ARCH:-90}; version=${VERSION:-1.7.0}
cuda=${CUDA_HOME:-/usr/local/cuda}
command -v "$py" >/dev/null || { echo "build_causal_conv1d: error: $py not found; set PYTHON to the GPU machine's Python" >&2; exit 2; }
[ -x "$cuda/bin/nvcc" ] || { echo "build_causal_conv1d: error: no nvcc under $cuda; set CUDA_HOME" >&2; exit 2; }
[[ $arch =~ ^[0-9]+a?$ ]] || { echo "build_causal_conv1d: error: ARCH=$arch is not an SM number such as 90 or 100a" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
pip=("$work/venv/bin/pip" -q)
"${pip[@]}" install "torch==$torch_version" setuptools wheel ninja packaging
# the sdist's metadata step imports torch: no build isolation, so it sees the venv's
"${pip[@]}" download --no-deps --no-binary :all: --no-build-isolation "causal-conv1d==$version" -d "$work/src"
tar xzf "$work"/src/causal_conv1d-"$version".tar.gz -C "$work"
src="$work/causal_conv1d-$version"
# one architecture: the gencode flags the setup collects are replaced just before it adds the ABI flag
"$work/venv/bin/python" - "$src/setup.py" "$arch" <<'EOF'
import sys
path, arch = sys.argv[1], sys.argv[2]
text = open(path).read()
marker = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
if marker not in text:
    sys.exit(f"build_causal_conv1d: error: {path} has no line {marker.strip()!r} to patch; pick another VERSION")
only = (f'    cc_flag = [f for f in cc_flag if not f.startswith(("-gencode", "arch="))] + '
        f'["-gencode", "arch=compute_{arch},code=sm_{arch}"]\n')
open(path, "w").write(text.replace(marker, only + marker, 1))
EOF
mkdir -p "$out"
(cd "$src" && CUDA_HOME="$cuda" PATH="$cuda/bin:$PATH" CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${JOBS:-2} \
  "$work/venv/bin/pip" wheel -q --no-deps --no-build-isolation --no-index -w "$out" .)
# the extension's symbol tables are a large part of it; strip them and repack (wheel pack rewrites RECORD), so the
# wheel fits beside the FlashInfer bundle in what one device call carries
wheel=$(ls "$out"/causal_conv1d-"$version"-*.whl)
"$work/venv/bin/python" -m wheel unpack -d "$work/unpacked" "$wheel" >/dev/null
find "$work/unpacked" -name '*.so' -exec strip --strip-unneeded {} +
rm "$wheel"
"$work/venv/bin/python" -m wheel pack -d "$out" "$work"/unpacked/causal_conv1d-"$version" >/dev/null
ls -la "$out"/causal_conv1d-"$version"-*.whl
