#!/usr/bin/env bash
# One entry point that sets itself up: creates .venv from requirements.txt on first use (and again
# only when requirements.txt changes), then runs the pipeline or the tests inside it.
#   ./dev.sh run --config config.toml --stage all     # python main.py ARGS
#   ./dev.sh test [pytest args]                       # the test suite in 2 processes (.ci/run calls this)
#   ./dev.sh bench [name]                             # the benchmarks in bench/
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"  # `run` keeps the caller's folder: its paths are the caller's

venv="$root/.venv"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "perf4sight: setting up $venv (first run or requirements.txt changed; about 2 minutes)" >&2
  made_here=0; [ -e "$venv" ] || made_here=1
  rm -f "$stamp"  # until pip has finished: a failed update must not be taken for the last setup that worked
  if ! { { python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"; } &&
         "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/requirements.txt" \
           2> >(grep -v "is ignored: it is neither" >&2); }; then
    [ "$made_here" = 0 ] || rm -rf "$venv"  # a half-made new environment: gigabytes that no later run would use
    free_gb="$(df -Pk "$root" | awk 'NR == 2 {printf "%.1f", $4 / 1048576}')"
    echo "perf4sight: could not set up $venv (the error is above); $free_gb GB free there, and the pinned" \
         "requirements take about 6 GB" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

ensure_test_tools() {  # SSH tests start their own sshd on 127.0.0.1; report tests open HTML in headless Chromium
  local missing=()
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v chromium >/dev/null || missing+=(chromium)
  if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "perf4sight: installing ${missing[*]} for the tests" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
      || echo "perf4sight: could not install ${missing[*]}; the tests that need them will skip" >&2
  fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  run)   exec "$venv/bin/python" "$root/main.py" "$@" ;;
  test)  ensure_test_tools; cd "$root"; exec "$venv/bin/python" -m pytest -q -n 2 --dist loadfile "$@" ;;
  bench) cd "$root"; exec "$venv/bin/python" bench/run_all.py "$@" ;;
  *)     echo "usage: ./dev.sh run MAIN_ARGS... | test [PYTEST_ARGS...] | bench [NAME]" >&2; exit 2 ;;
esac
