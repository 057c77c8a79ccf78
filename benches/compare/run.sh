#!/usr/bin/env bash
# Create benches/compare/.venv from the pinned requirements (once, and again whenever
# requirements.txt changes), then run run.py inside it with the given arguments.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
    echo "$want" > "$venv/.requirements.sha256"
fi
exec "$venv/bin/python" "$here/run.py" "$@"
