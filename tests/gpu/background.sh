#!/bin/bash
# background.sh — run a device chain past one call's limit, and bring its output back as one file.
#
#   bash tests/gpu/background.sh start SCRIPT   run SCRIPT detached (setsid), in this directory; returns at once
#   bash tests/gpu/background.sh wait SECONDS   wait until SCRIPT's log says done (or SECONDS pass), then put
#                                               /tmp/o as $OUT/o.tgz and print its progress log
#
# SCRIPT writes its results under /tmp/o and appends "[HH:MM:SS] what" lines to /tmp/o/chain.txt, the last one
# "[...] done". Why: a call returns at most 8 files (a tarball is one), lasts at most 10 minutes, and the
# machine goes back after ~30 s idle, so chain the `wait` calls back to back (the 2026-12-06b results came this
# way).
set -u
case ${1:-} in
start)
  mkdir -p /tmp/o
  setsid nohup bash "$2" > /tmp/o/chain.out 2>&1 < /dev/null &
  sleep 1
  echo "started $2 (pid $!)"
  ;;
wait)
  end=$(($(date +%s) + ${2:-540}))
  while [ "$(date +%s)" -lt $end ]; do
    grep -q "\] done" /tmp/o/chain.txt 2>/dev/null && break
    sleep 5
  done
  sleep 2
  tar -C /tmp/o -czf "${OUT:-.}/o.tgz" . && cat /tmp/o/chain.txt
  ;;
*)
  sed -n '2,11p' "$0"
  exit 2
  ;;
esac
