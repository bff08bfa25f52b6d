#!/usr/bin/env bash
# The external programs the tests talk to, as Debian packages: `package check` per line, where the check
# is a command that succeeds when the package is usable (a program on PATH, or a Python module of the
# system's python: test/interface/python-client.test.ts runs /usr/bin/python3, whatever python3 PATH finds first).
# The test command (`npm test`) and CI both run this, so there is one list. Missing peers are installed
# when we run as root with apt; otherwise we stop at once with the one command that installs them.
set -euo pipefail

PEERS=(
  "gnupg command -v gpg"
  "sq command -v sq"
  "chromium command -v chromium"
  "tmux command -v tmux"
  "python3-requests /usr/bin/python3 -c 'import requests'"
  "softhsm2 command -v softhsm2-util"
  "redis-server command -v redis-server"
  "redis-tools command -v redis-cli"
  "pgbouncer test -x /usr/sbin/pgbouncer"
)

missing=()
for peer in "${PEERS[@]}"; do
  read -r pkg check <<<"$peer"
  eval "$check" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test peers: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  exit 0
fi

echo "The tests need: ${missing[*]}. Install them with:" >&2
echo "  sudo apt-get install -y ${missing[*]}" >&2
exit 1
