#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine: the package with its
# test extras (CPU torch 2.13.0 from the local index), and Debian's chromium for
# the dashboard's browser tests. Idempotent: fast when everything is present.
set -euo pipefail
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install --quiet -e ".[test]"
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "install_test_deps: installing Debian's chromium"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "install_test_deps: chromium missing and not root; browser tests will be skipped" >&2
    fi
fi
