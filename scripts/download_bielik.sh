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
# BIELIK_BASE_URL replaces the Hub's download address (a mirror, or a local server for
# testing this script); the hf CLI is then not used.
# A .safetensors file counts as complete only when it is as long as its own header says
# (a broken-off download is resumed, never taken for the whole file).
set -euo pipefail

repo="speakleash/Bielik-1.5B-v3.0-Instruct"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/models/bielik-1.5b-v3.0-instruct}"
base="${BIELIK_BASE_URL:-https://huggingface.co/$repo/resolve/main}"
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

# safetensors_whole <path>: the file is exactly as long as its header says: 8 bytes
# (little-endian u64: the header's length), the JSON header, then the tensor data up to
# the largest "data_offsets" end. A download that broke off is shorter.
safetensors_whole() {
  local path="$1" size header_len end
  size=$(wc -c <"$path" | tr -d ' ')
  [ "$size" -ge 8 ] || return 1
  header_len=$(od -An -tu8 -N8 "$path" | tr -d ' ')  # od reads in host order: little endian on x86 and ARM
  [ "${#header_len}" -le 12 ] && [ "$header_len" -le $((size - 8)) ] || return 1
  end=$(head -c $((8 + header_len)) "$path" | tail -c "$header_len" |
        grep -oE '"data_offsets" *: *\[ *[0-9]+ *, *[0-9]+ *\]' | grep -oE '[0-9]+ *\]$' | tr -d ' ]' | sort -n | tail -n 1)
  [ -n "$end" ] && [ "$size" -eq $((8 + header_len + end)) ]
}

# have <file>: in place, and for weights, whole.
have() {
  [ -s "$out/$1" ] || return 1
  case "$1" in
    *.safetensors) safetensors_whole "$out/$1" ;;
  esac
}

# Complete already? (index + every shard it names, or the single file, plus the small files)
weights_complete() {
  if [ -s "$out/model.safetensors.index.json" ]; then
    local shard
    for shard in $(grep -o '"model-[0-9]*-of-[0-9]*\.safetensors"' "$out/model.safetensors.index.json" | tr -d '"' | sort -u); do
      have "$shard" || return 1
    done
    return 0
  fi
  have model.safetensors
}
all_complete() {
  local f
  for f in "${small_files[@]}"; do have "$f" || return 1; done
  weights_complete
}

mkdir -p "$out"
if all_complete; then
  say "$out is already complete"
  exit 0
fi

# 1. The Hugging Face CLI, if present (resumes, verifies, uses a cached login).
hf_cli=""
if [ -n "${BIELIK_BASE_URL:-}" ]; then hf_cli="";  # the CLI knows only the Hub
elif command -v hf >/dev/null 2>&1; then hf_cli="hf"; elif command -v huggingface-cli >/dev/null 2>&1; then hf_cli="huggingface-cli"; fi
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
  local file="$1" optional="${2:-}" status code=0
  have "$file" && return 0
  case "$file" in  # a whole .part: stopped between curl and the rename below
    *.safetensors) if [ -s "$out/$file.part" ] && safetensors_whole "$out/$file.part"; then
                     mv "$out/$file.part" "$out/$file"
                     return 0
                   fi ;;
  esac
  if [ -s "$out/$file" ]; then  # cut short by an earlier version of this script: resume it
    say "$file is incomplete; resuming it"
    mv "$out/$file" "$out/$file.part"
  fi
  say "GET $base/$file"
  # --fail: an error status writes nothing, so no error page is ever appended to a .part.
  status=$(curl -sS -L --fail --retry 3 --connect-timeout 20 -C - "${auth[@]}" -o "$out/$file.part" \
                -w '%{http_code}' "$base/$file" 2>"$out/$file.curl-errors") || code=$?
  status="${status:-000}"
  # curl's own words, except for an optional file's expected 404.
  [ "$status" = 404 ] && [ -n "$optional" ] || cat "$out/$file.curl-errors" >&2
  rm -f "$out/$file.curl-errors"
  case "$status" in
    200|206)
      # curl reports the response's status even when the transfer broke off (exit 18:
      # the connection closed early), so only its exit code says the .part is whole.
      [ "$code" -eq 0 ] || manual_instructions "$file: the download broke off (curl exit $code); run this script again to resume it"
      case "$file" in
        *.safetensors)
          if ! safetensors_whole "$out/$file.part"; then
            rm -f "$out/$file.part"  # longer or malformed: resuming it could never help
            manual_instructions "$file: the downloaded file is not as long as its header says (removed)"
          fi ;;
      esac
      mv "$out/$file.part" "$out/$file" ;;
    404) rm -f "$out/$file.part"; [ -n "$optional" ] && return 2; manual_instructions "$file: HTTP 404" ;;
    416) rm -f "$out/$file.part"  # the .part is longer than the file: nothing to resume
         manual_instructions "$file: the partial download was longer than the file (removed); run this script again" ;;
    401|403) rm -f "$out/$file.part"; manual_instructions "$file: HTTP $status, the Hub wants a login (HF_TOKEN)" ;;
    000) manual_instructions "$file: no connection to ${base%%/resolve/*}" ;;
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
