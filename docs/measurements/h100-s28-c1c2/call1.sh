#!/usr/bin/env bash
# Session 28, call 1 (on an H100: no H200 was lent): the issues' target table on main's defaults at 79993d7.
DEADLINE=555 scripts/h200_targets.sh
