#!/bin/bash
# poll.sh SECONDS: wait for /tmp/o/chain.txt to say done (or the time to pass), then copy a tarball of /tmp/o to $OUT
end=$(( $(date +%s) + ${1:-540} ))
while [ $(date +%s) -lt $end ]; do grep -q "\] done" /tmp/o/chain.txt 2>/dev/null && break; sleep 5; done
sleep 3; tar -C /tmp/o -czf $OUT/o.tgz . ; cat /tmp/o/chain.txt
