#!/usr/bin/env bash
# Install Debian's headless-capable Chromium (/usr/bin/chromium) for the report's browser
# test, when it is missing. Idempotent: does nothing when the browser is already there.
# Runs apt-get directly (the CI and dev containers run as root), or through sudo if not.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=()
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
/usr/bin/chromium --version
