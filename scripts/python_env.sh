#!/usr/bin/env bash
# Prints the path of a Python that has the golden generators' packages
# (golden/requirements.txt). Prefers an existing interpreter that already has them
# (the GPU machine has no network but ships numpy, ml_dtypes, tokenizers); otherwise
# creates the project-local virtualenv .venv and installs the requirements from PyPI.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
requirements="$root/golden/requirements.txt"
venv="$root/.venv"
# Module names to import-check: the requirement names, one per line, pins stripped.
modules=$(sed -e 's/#.*//' -e 's/[<>=!~ ].*//' -e '/^$/d' "$requirements" | tr '-' '_' | paste -sd, -)

usable() { "$1" -c "import $modules" >/dev/null 2>&1; }

if [ -x "$venv/bin/python" ] && usable "$venv/bin/python" \
   && [ "$venv/.installed" -nt "$requirements" ]; then
  echo "$venv/bin/python"; exit 0
fi
for candidate in "${PYTHON:-}" python3; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null && usable "$candidate"; then
    command -v "$candidate"; exit 0
  fi
done

echo "python_env: creating $venv and installing golden/requirements.txt" >&2
python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --upgrade pip >&2 || true
"$venv/bin/python" -m pip install -q -r "$requirements" >&2
touch "$venv/.installed"
echo "$venv/bin/python"
