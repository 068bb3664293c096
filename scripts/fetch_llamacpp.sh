#!/usr/bin/env bash
# Fetches llama.cpp's source for the same-GPU baseline of issue 7 (scripts/bench_llamacpp.py):
#
#   bash scripts/fetch_llamacpp.sh        # on a machine that reaches PyPI
#
# The GPU machines here reach no network, so the source is fetched on this side and
# travels with the working tree (the device tool's `carry: ["third_party/llama.cpp"]`).
# It comes from PyPI, which these machines reach: the source distribution of
# llama-cpp-python (pinned by version and sha256) vendors a whole llama.cpp tree.
# Only what a CUDA build of llama-bench and the GGUF writer need is kept (~30 MB of the
# 176 MB: no models' vocabularies, docs, tests, web UI or other GPU backends), in
# third_party/llama.cpp, which git ignores: nothing of llama.cpp is part of this project.
# Idempotent: an existing tree of the pinned version is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.3.36  # llama-cpp-python; vendors llama.cpp commit 0c1e570 (2026-10-01)
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
dest=third_party/llama.cpp
stamp="$dest/.fetched-from"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "llama-cpp-python==$version" ]; then
  echo "fetch_llamacpp: $dest is already llama-cpp-python==$version's llama.cpp"
  exit 0
fi

python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_llamacpp: downloading llama-cpp-python==$version (source distribution, ~77 MB) from PyPI"
"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp" >/dev/null
archive="$tmp/llama_cpp_python-$version.tar.gz"
[ -f "$archive" ] || { echo "fetch_llamacpp: pip left no $archive" >&2; exit 1; }
echo "$sha256  $archive" | sha256sum --check --quiet - || {
  echo "fetch_llamacpp: $archive does not have the pinned sha256 $sha256" >&2; exit 1; }

top="llama_cpp_python-$version/vendor/llama.cpp"
# What the build of llama-bench and gguf-py do not need (.git: a link into the
# archive's own git folder, which is not extracted). The other GPU backends' folders
# are only entered when their GGML_<backend> option is on, which bench_llamacpp.py leaves off.
excludes=()
for path in models docs tests examples media benches pocs skills ci .devops .github app tools/ui tools/server \
            ggml/src/ggml-cann ggml/src/ggml-et ggml/src/ggml-hexagon ggml/src/ggml-metal ggml/src/ggml-musa \
            ggml/src/ggml-opencl ggml/src/ggml-openvino ggml/src/ggml-sycl ggml/src/ggml-virtgpu \
            ggml/src/ggml-vulkan ggml/src/ggml-webgpu ggml/src/ggml-zdnn ggml/src/ggml-zendnn .git; do
  excludes+=("--exclude=$top/$path")
done
head_file="llama_cpp_python-$version/.git/modules/vendor/llama.cpp/HEAD"  # the vendored commit
tar -xzf "$archive" -C "$tmp" "${excludes[@]}" "$top" "$head_file"
rm -rf "$dest.partial" && mkdir -p "$(dirname "$dest")"
mv "$tmp/$top" "$dest.partial"
# The tree has no git history of its own, so its commit is kept here for the build
# (bench_llamacpp.py passes it as LLAMA_BUILD_COMMIT, which llama-bench reports).
head -c 7 "$tmp/$head_file" > "$dest.partial/.commit"
echo "llama-cpp-python==$version" > "$dest.partial/.fetched-from"
rm -rf "$dest" && mv "$dest.partial" "$dest"
echo "fetch_llamacpp: $dest ($(du -sh "$dest" | cut -f1)), llama.cpp commit $(cat "$dest/.commit"), its MIT licence in $dest/LICENSE"
