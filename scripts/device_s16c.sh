#!/usr/bin/env bash
# Session 16, call 3: host time a call, the session's start (tmp_old) and the final code
# (tmp_new: the replay with its last cuts, after the dropout revert) in one call.
set -u
out=$1
root=$PWD
cd tmp_new
base=$PYTHONPATH
PYTHONPATH=$root/tmp_old:$base timeout 40 python3 scripts/profile_host.py > "$out/a_host_old.txt" 2>&1
PYTHONPATH=$PWD:$base timeout 40 python3 scripts/profile_host.py > "$out/b_host_new.txt" 2>&1
cat "$out/a_host_old.txt" "$out/b_host_new.txt"
