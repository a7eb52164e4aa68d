#!/usr/bin/env bash
# A two-node Slurm cluster on this machine, for rehearsing multi-node launches:
#   tools/local_cluster.sh up DIR [--nodes 2 --gpus 2]; export SLURM_CONF=DIR/slurm.conf
#   tools/local_cluster.sh kill-node DIR n2    # a node dies (up again brings it back)
#   tools/local_cluster.sh down DIR            # stops, by pid, what up started
# The work is done by launch/local_cluster.py (run with this environment's Python).
set -euo pipefail
exec "${PYTHON:-python}" -m launch.local_cluster "$@"
