#!/usr/bin/env bash
# The names of the tests' and the demo's own "internet", on loopback: a package
# registry the policies allow and a collector they do not. Idempotent; the lines
# carry a marker so they can be told apart from the host's own entries.
set -euo pipefail
marker="# agent-sandbox test hosts"
if ! grep -q "$marker" /etc/hosts; then
    {
        echo "127.0.0.2 registry.agent-sandbox.test $marker"
        echo "127.0.0.3 collector.agent-sandbox.test $marker"
    } >>/etc/hosts
fi
