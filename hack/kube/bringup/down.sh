#!/bin/bash
# Hand bring-up used to prove and measure the real control plane (docs/dev/kube-real-plane.md);
# not used by make run or the tests yet (issue 21 wires the control plane into localcluster).
# Stops the processes up.sh started in $D (by their recorded pids), scheduler first, etcd last.
D=${D:?}
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do
  [ -f $D/$c.pid ] || continue
  p=$(cat $D/$c.pid); s=$(date +%s.%N); kill $p 2>/dev/null
  for i in $(seq 100); do kill -0 $p 2>/dev/null || break; sleep 0.1; done
  kill -0 $p 2>/dev/null && { echo "$c did not stop on TERM"; kill -9 $p; }
  echo "$c stopped in $(python3 -c "import time; print(round(time.time()-$s,2))") s"; rm -f $D/$c.pid
done
