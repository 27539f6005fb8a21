#!/usr/bin/env bash
# Prepare a virtualenv with NVIDIA NeMo Gym (from PyPI) that the interoperability tests
# (tests/interop/) run NeMo Gym's servers, agent and CLIs from:
#
#   scripts/interop_venv.sh          # NeMo Gym 0.4.0 on Python 3.12
#   scripts/interop_venv.sh 0.7.0    # NeMo Gym 0.7.0 on Python 3.13
#
# 0.7.0 declares Requires-Python >=3.13.14; it installs, imports and serves on 3.13.0 (what
# pyenv has here), so it is installed with --ignore-requires-python (see docs/porting.md).
#
# Idempotent: a venv that already holds the right version (checked by importing it) is reused
# as is; concurrent runs wait for each other. Prints the venv path as the last line on stdout;
# progress goes to stderr. Then:
#
#   NEMO_GYM_INTEROP_PYTHON="$(scripts/interop_venv.sh | tail -1)/bin/python" python -m pytest tests/interop
#
# Environment (0.4.0; for 0.7.0 the same names with INTEROP07: NEMO_GYM_INTEROP07_VENV, ...):
#   NEMO_GYM_INTEROP_VENV     where the venv lives (default ~/.cache/nemo_gym_env/interop-venv,
#                             and ~/.cache/nemo_gym_env/interop-venv-0.7 for 0.7.0)
#   NEMO_GYM_INTEROP_PYTHON3  the interpreter to build it with (default: python3.12, then pyenv's
#                             3.12.x; for 0.7.0 python3.13, then pyenv's 3.13.x, installed with
#                             `pyenv install -s 3.13.0` when pyenv has none)
#
# Nothing else is needed offline: NeMo Gym's own servers used by the tests (the examples, mcqa,
# simple_agent, openai_model, vllm_model) need only nemo-gym's dependencies, and the tests
# point NeMo Gym's per-server venvs at this one (skip_venv_if_present), so it never calls uv.
set -euo pipefail

NEMO_GYM_VERSION="${1:-0.4.0}"
case "$NEMO_GYM_VERSION" in
  0.4.0)
    PY_MINOR=12
    VENV="${NEMO_GYM_INTEROP_VENV:-$HOME/.cache/nemo_gym_env/interop-venv}"
    PY_WANTED="${NEMO_GYM_INTEROP_PYTHON3:-}"
    PIP_FLAGS=()
    CHECK_MODULES="nemo_gym.rollout_collection, nemo_gym.cli.env"
    ;;
  0.7.0)
    PY_MINOR=13
    VENV="${NEMO_GYM_INTEROP07_VENV:-$HOME/.cache/nemo_gym_env/interop-venv-0.7}"
    PY_WANTED="${NEMO_GYM_INTEROP07_PYTHON3:-}"
    PIP_FLAGS=(--ignore-requires-python)  # 0.7.0 asks for >=3.13.14; it runs on 3.13.0
    CHECK_MODULES="nemo_gym.cli.env, resources_servers.gymnasium"
    ;;
  *) echo "[interop_venv] unknown NeMo Gym version $NEMO_GYM_VERSION (0.4.0 or 0.7.0)" >&2; exit 2 ;;
esac
STAMP="$VENV/.nemo_gym_env_interop_ok"
log() { echo "[interop_venv] $*" >&2; }

# The venv is usable when nemo-gym has the wanted version and the modules the tests run import.
check() {
  "$VENV/bin/python" - "$NEMO_GYM_VERSION" "$CHECK_MODULES" <<'PY' >&2
import importlib
import sys
from importlib.metadata import version

want = sys.argv[1]
got = version("nemo-gym")
assert got == want, f"nemo-gym {got} installed, {want} wanted"
for name in ["nemo_gym.base_resources_server", *sys.argv[2].split(", ")]:
    importlib.import_module(name)
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
  for c in "$PY_WANTED" "python3.$PY_MINOR" "$HOME"/.pyenv/versions/3.$PY_MINOR*/bin/python; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 \
      && "$c" -c "import sys; sys.exit(sys.version_info[:2] != (3, $PY_MINOR))" 2>/dev/null; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

if ! PY="$(find_python)" && [ "$PY_MINOR" = 13 ] && command -v pyenv >/dev/null 2>&1; then
  log "no Python 3.13 found; pyenv install -s 3.13.0"
  pyenv install -s 3.13.0 >&2
  PY="$(find_python)" || true
fi
[ -n "${PY:-}" ] || { log "no Python 3.$PY_MINOR found; set the PYTHON3 variable above"; exit 1; }
start=$(date +%s)
log "building $VENV with $PY (nemo-gym==$NEMO_GYM_VERSION from PyPI)"
rm -f "$STAMP"
if ! "$VENV/bin/python" -c "import sys; sys.exit(sys.version_info[:2] != (3, $PY_MINOR))" 2>/dev/null; then
  "$PY" -m venv --clear "$VENV"
fi

# Hide pip's warnings about local find-links/index folders without that package (machine config).
pip_install() {
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}
pip_install --upgrade pip
pip_install "${PIP_FLAGS[@]}" "nemo-gym==$NEMO_GYM_VERSION"
check
echo "$NEMO_GYM_VERSION" > "$STAMP"
log "built in $(( $(date +%s) - start )) s"
echo "$VENV"
