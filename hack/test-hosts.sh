#!/usr/bin/env bash
# The names of the tests' and the demo's own "internet", given through /etc/hosts
# (the host-side resolver the egress proxy uses): a package registry the policies
# allow, a collector they do not, a zone for wildcard rules (its apex, an allowed
# mirror and a denied subdomain), an internal name on loopback, and a name that
# resolves to the cloud metadata address. Idempotent, one line per name; the lines
# carry a marker so they can be told apart from the host's own entries.
set -euo pipefail
marker="# agent-sandbox test hosts"
entries=(
    "127.0.0.2 registry.agent-sandbox.test"
    "127.0.0.3 collector.agent-sandbox.test"
    "127.0.0.4 pkg.agent-sandbox.test"
    "127.0.0.4 mirror.pkg.agent-sandbox.test"
    "127.0.0.4 secret.pkg.agent-sandbox.test"
    "127.0.0.5 internal.agent-sandbox.test"
    "169.254.169.254 metadata.agent-sandbox.test"
)
for entry in "${entries[@]}"; do
    name=${entry#* }
    if ! grep -qE "^[0-9a-f.:]+[[:space:]]+${name//./\\.}[[:space:]]+$marker\$" /etc/hosts; then
        echo "$entry $marker" >>/etc/hosts
    fi
done
