#!/usr/bin/env bash
# Downloads Bielik-1.5B-v3.0-Instruct (speakleash/Bielik-1.5B-v3.0-Instruct on the
# Hugging Face Hub) in HF layout into models/bielik-1.5b-v3.0-instruct/:
#   config.json, tokenizer.json, tokenizer_config.json, and the weights: either
#   model.safetensors, or model.safetensors.index.json plus the shards it lists.
#
# Usage: bash scripts/download_bielik.sh [output_dir]
# Uses `hf` / `huggingface-cli` when installed, otherwise curl. Set HF_TOKEN if the Hub
# asks you to log in (gated model: accept its terms on the model page first).
# Without network access it says exactly which files to fetch by hand, and exits 1.
set -euo pipefail

repo="speakleash/Bielik-1.5B-v3.0-Instruct"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/models/bielik-1.5b-v3.0-instruct}"
base="https://huggingface.co/$repo/resolve/main"
small_files=(config.json tokenizer.json tokenizer_config.json)

say() { echo "download_bielik: $*" >&2; }

manual_instructions() {
  say "could not download $repo ($1)."
  cat >&2 <<EOF

Download these files by hand (a browser on a machine with internet access works) from
  https://huggingface.co/$repo/tree/main
and put them into
  $out/
    config.json
    tokenizer.json
    tokenizer_config.json
    model.safetensors                      (one file, ~3.2 GB), or if the repository is sharded:
    model.safetensors.index.json + every model-0000K-of-0000N.safetensors it lists
Each is at $base/<file>. If the Hub answers 401/403, accept the model's terms on its
page and export HF_TOKEN=<your token> before running this script again.
EOF
  exit 1
}

# Complete already? (index + every shard it names, or the single file, plus the small files)
weights_complete() {
  if [ -s "$out/model.safetensors.index.json" ]; then
    local shard
    for shard in $(grep -o '"model-[0-9]*-of-[0-9]*\.safetensors"' "$out/model.safetensors.index.json" | tr -d '"' | sort -u); do
      [ -s "$out/$shard" ] || return 1
    done
    return 0
  fi
  [ -s "$out/model.safetensors" ]
}
all_complete() {
  local f
  for f in "${small_files[@]}"; do [ -s "$out/$f" ] || return 1; done
  weights_complete
}

mkdir -p "$out"
if all_complete; then
  say "$out is already complete"
  exit 0
fi

# 1. The Hugging Face CLI, if present (resumes, verifies, uses a cached login).
hf_cli=""
if command -v hf >/dev/null 2>&1; then hf_cli="hf"; elif command -v huggingface-cli >/dev/null 2>&1; then hf_cli="huggingface-cli"; fi
if [ -n "$hf_cli" ]; then
  say "downloading with $hf_cli into $out"
  if "$hf_cli" download "$repo" "${small_files[@]}" --local-dir "$out" &&
     "$hf_cli" download "$repo" --include "model*.safetensors*" --local-dir "$out" && all_complete; then
    say "done: $out"
    exit 0
  fi
  say "$hf_cli failed; trying curl"
fi

# 2. Plain HTTPS with curl: each file to <name>.part, resumed on retry, renamed when whole.
command -v curl >/dev/null 2>&1 || manual_instructions "neither hf/huggingface-cli nor curl is installed"
auth=()
[ -n "${HF_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $HF_TOKEN")

# fetch <file> [optional]: returns 0 on success; 2 when an optional file does not exist (404).
fetch() {
  local file="$1" optional="${2:-}" status
  [ -s "$out/$file" ] && return 0
  say "GET $base/$file"
  status=$(curl -sS -L --retry 3 --connect-timeout 20 -C - "${auth[@]}" -o "$out/$file.part" \
                -w '%{http_code}' "$base/$file") || status="${status:-000}"
  case "$status" in
    200|206) mv "$out/$file.part" "$out/$file" ;;
    404) rm -f "$out/$file.part"; [ -n "$optional" ] && return 2; manual_instructions "$file: HTTP 404" ;;
    401|403) rm -f "$out/$file.part"; manual_instructions "$file: HTTP $status, the Hub wants a login (HF_TOKEN)" ;;
    000) manual_instructions "$file: no connection to huggingface.co" ;;
    *) manual_instructions "$file: HTTP $status" ;;
  esac
}

for f in "${small_files[@]}"; do fetch "$f"; done
if fetch model.safetensors.index.json optional; then
  for shard in $(grep -o '"model-[0-9]*-of-[0-9]*\.safetensors"' "$out/model.safetensors.index.json" | tr -d '"' | sort -u); do
    fetch "$shard"
  done
else
  fetch model.safetensors
fi

all_complete || manual_instructions "some files are still missing in $out"
say "done: $out"
