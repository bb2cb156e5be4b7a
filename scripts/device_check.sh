#!/usr/bin/env bash
# The device check (docs/device-check.md): scripts/device_check.py, under the name people and docs run on the GPU machine.
exec python3 "$(dirname "$0")/device_check.py" "$@"
