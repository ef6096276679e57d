#!/usr/bin/env bash
# The headless browser of the web UI's integration test (tests/integration/ui/): Debian's chromium,
# driven by Playwright from PyPI with executable_path=/usr/bin/chromium (never `playwright install`).
# Usage: browser.sh install|status
#   install  apt-get install chromium (and a font for its text) only when /usr/bin/chromium is
#            missing; idempotent. Called by `make test` before pytest and by the test session.
#   status   print up (installed, with its version) or down
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHROMIUM_BIN=/usr/bin/chromium

install() {
  if [[ ! -x "$CHROMIUM_BIN" ]]; then
    apt_get_install browser chromium fonts-dejavu-core
    [[ -x "$CHROMIUM_BIN" ]] || fail browser "no $CHROMIUM_BIN after installing chromium"
  fi
}

status() {
  if [[ -x "$CHROMIUM_BIN" ]]; then
    echo "browser: installed ($("$CHROMIUM_BIN" --version 2>/dev/null || echo "version unknown"))"
  else
    echo "browser: not installed"
  fi
}

case "${1:-status}" in
  install) install ;;
  status) status ;;
  *) echo "usage: browser.sh install|status" >&2; exit 2 ;;
esac
