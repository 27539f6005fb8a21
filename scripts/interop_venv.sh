#!/usr/bin/env bash
# Prepare the Python 3.12 virtualenv with NVIDIA NeMo Gym 0.4.0 (from PyPI) that the
# interoperability tests (tests/interop/) run NeMo Gym's servers, agent and CLIs from.
#
# Idempotent: a venv that already holds the right version (checked by importing it) is reused
# as is; concurrent runs wait for each other. Prints the venv path as the last line on stdout;
# progress goes to stderr. Then:
#
#   NEMO_GYM_INTEROP_PYTHON="$(scripts/interop_venv.sh | tail -1)/bin/python" python -m pytest tests/interop
#
# Environment:
#   NEMO_GYM_INTEROP_VENV     where the venv lives (default ~/.cache/nemo_gym_env/interop-venv)
#   NEMO_GYM_INTEROP_PYTHON3  the Python 3.12 interpreter to build it with (default: python3.12,
#                             then pyenv's 3.12.x)
#
# Nothing else is needed offline: NeMo Gym's own servers used by the tests (the examples, mcqa,
# simple_agent, openai_model, vllm_model) need only nemo-gym's dependencies, and the tests
# point NeMo Gym's per-server venvs at this one (skip_venv_if_present), so it never calls uv.
set -euo pipefail

NEMO_GYM_VERSION="0.4.0"
VENV="${NEMO_GYM_INTEROP_VENV:-$HOME/.cache/nemo_gym_env/interop-venv}"
STAMP="$VENV/.nemo_gym_env_interop_ok"
log() { echo "[interop_venv] $*" >&2; }

# The venv is usable when nemo-gym has the wanted version and the modules the tests run import.
check() {
  "$VENV/bin/python" - "$NEMO_GYM_VERSION" <<'PY' >&2
import sys
from importlib.metadata import version

want = sys.argv[1]
got = version("nemo-gym")
assert got == want, f"nemo-gym {got} installed, {want} wanted"
import nemo_gym.base_resources_server, nemo_gym.rollout_collection, nemo_gym.cli.env  # noqa: E401,F401
import ray, uvicorn, aiohttp  # noqa: E401,F401
print(f"[interop_venv] nemo-gym {got} OK ({sys.executable})")
PY
}

mkdir -p "$(dirname "$VENV")"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$VENV.lock"
  flock 9
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$NEMO_GYM_VERSION" ] && check; then
  log "reusing $VENV"
  echo "$VENV"
  exit 0
fi

find_python() {
  local c
  for c in "${NEMO_GYM_INTEROP_PYTHON3:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 \
      && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

PY312="$(find_python)" || { log "no Python 3.12 found; set NEMO_GYM_INTEROP_PYTHON3"; exit 1; }
start=$(date +%s)
log "building $VENV with $PY312 (nemo-gym==$NEMO_GYM_VERSION from PyPI)"
rm -f "$STAMP"
if ! "$VENV/bin/python" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" 2>/dev/null; then
  "$PY312" -m venv --clear "$VENV"
fi

# Hide pip's warnings about local find-links/index folders without that package (machine config).
pip_install() {
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}
pip_install --upgrade pip
pip_install "nemo-gym==$NEMO_GYM_VERSION"
check
echo "$NEMO_GYM_VERSION" > "$STAMP"
log "built in $(( $(date +%s) - start )) s"
echo "$VENV"
