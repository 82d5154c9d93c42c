#!/bin/sh
# Install headless Chromium for the HTML report test (tests/test_report_html.py, marker "browser").
# Idempotent: does nothing when /usr/bin/chromium is already there. Needs root (or sudo).
set -eu
if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium
chromium --version
