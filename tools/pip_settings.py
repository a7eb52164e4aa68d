"""`pip config list` (on stdin) as one pip.conf (on stdout): every setting pip uses here,
from its config files and PIP_* variables; a key set twice keeps pip's last value."""

import sys

settings: dict[str, str] = {}
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    if key and value:
        settings[key.split(".", 1)[1]] = value.strip("'\"")
print("[global]")
for key, value in settings.items():
    print(f"{key} = {value}")
