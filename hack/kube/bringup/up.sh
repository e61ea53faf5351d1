#!/bin/bash
# Hand bring-up used to prove and measure the real control plane (docs/dev/kube-real-plane.md);
# not used by make run or the tests yet (issue 21 wires the control plane into localcluster).
# Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler from the cached binary
# in $D; prints timings. Usage: D=/tmp/kp SVC_RANGE=127.16.0.0/16 SVC_IP=127.16.0.1 up.sh
set -euo pipefail
KUBE=${KUBE:?}
D=${D:?}; SVC_RANGE=${SVC_RANGE:-127.16.0.0/16}; SVC_IP=${SVC_IP:-127.16.0.1}
ETCD_PORT=${ETCD_PORT:-23790}; PEER_PORT=${PEER_PORT:-23800}; API_PORT=${API_PORT:-26443}
KCM_PORT=${KCM_PORT:-20257}; SCHED_PORT=${SCHED_PORT:-20259}
EXTRA_API=${EXTRA_API:-}; EXTRA_KCM=${EXTRA_KCM:-}; EXTRA_SCHED=${EXTRA_SCHED:-}
mkdir -p $D/log
[ -f $D/pki/ca.crt ] || SVC_IP=$SVC_IP "$(dirname "$0")/certs.sh" $D
P=$D/pki
kubeconfig() { # file user cert
  cat > $D/$1.kubeconfig <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 $P/ca.crt)
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 $P/$3.crt)
    client-key-data: $(base64 -w0 $P/$3.key)
contexts:
- name: local
  context: {cluster: local, user: $2}
current-context: local
KC
  chmod 600 $D/$1.kubeconfig
}
kubeconfig admin admin admin
kubeconfig controller-manager system:kube-controller-manager controller-manager
kubeconfig scheduler system:kube-scheduler scheduler

now() { date +%s.%N; }
wait_for() { # name deadline-seconds command...
  local name=$1 dl=$2; shift 2; local end=$(( $(date +%s) + dl ))
  until "$@" >/dev/null 2>&1; do
    [ $(date +%s) -lt $end ] || { echo "TIMEOUT waiting for $name"; return 1; }
    sleep 0.1
  done
}
t0=$(now)
$KUBE etcd --name=local --data-dir=$D/etcd \
  --listen-client-urls=https://127.0.0.1:$ETCD_PORT --advertise-client-urls=https://127.0.0.1:$ETCD_PORT \
  --listen-peer-urls=http://127.0.0.1:$PEER_PORT --initial-advertise-peer-urls=http://127.0.0.1:$PEER_PORT \
  --initial-cluster=local=http://127.0.0.1:$PEER_PORT \
  --cert-file=$P/etcd-server.crt --key-file=$P/etcd-server.key \
  --client-cert-auth --trusted-ca-file=$P/ca.crt \
  --log-level=warn > $D/log/etcd.log 2>&1 &
echo $! > $D/etcd.pid
wait_for etcd 30 curl -sf --cacert $P/ca.crt --cert $P/apiserver-etcd-client.crt --key $P/apiserver-etcd-client.key https://127.0.0.1:$ETCD_PORT/health
t_etcd=$(now)
$KUBE kube-apiserver \
  --advertise-address=127.0.0.1 --bind-address=127.0.0.1 --secure-port=$API_PORT \
  --etcd-servers=https://127.0.0.1:$ETCD_PORT \
  --etcd-cafile=$P/ca.crt --etcd-certfile=$P/apiserver-etcd-client.crt --etcd-keyfile=$P/apiserver-etcd-client.key \
  --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key \
  --client-ca-file=$P/ca.crt \
  --authorization-mode=Node,RBAC \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key \
  --service-cluster-ip-range=$SVC_RANGE \
  --endpoint-reconciler-type=none \
  $EXTRA_API > $D/log/kube-apiserver.log 2>&1 &
echo $! > $D/kube-apiserver.pid
wait_for kube-apiserver 60 curl -sf --cacert $P/ca.crt --cert $P/admin.crt --key $P/admin.key https://127.0.0.1:$API_PORT/readyz
t_api=$(now)
$KUBE kube-controller-manager \
  --kubeconfig=$D/controller-manager.kubeconfig \
  --authentication-kubeconfig=$D/controller-manager.kubeconfig --authorization-kubeconfig=$D/controller-manager.kubeconfig \
  --bind-address=127.0.0.1 --secure-port=$KCM_PORT \
  --use-service-account-credentials=${SA_CREDS:-true} \
  --root-ca-file=$P/ca.crt \
  --flex-volume-plugin-dir=$D/flexvolume \
  $EXTRA_KCM --leader-elect=false > $D/log/kube-controller-manager.log 2>&1 &
echo $! > $D/kube-controller-manager.pid
$KUBE kube-scheduler \
  --kubeconfig=$D/scheduler.kubeconfig \
  --authentication-kubeconfig=$D/scheduler.kubeconfig --authorization-kubeconfig=$D/scheduler.kubeconfig \
  --bind-address=127.0.0.1 --secure-port=$SCHED_PORT \
  $EXTRA_SCHED --leader-elect=false > $D/log/kube-scheduler.log 2>&1 &
echo $! > $D/kube-scheduler.pid
wait_for kube-controller-manager 60 curl -sfk https://127.0.0.1:$KCM_PORT/healthz
t_kcm=$(now)
wait_for kube-scheduler 60 curl -sfk https://127.0.0.1:$SCHED_PORT/healthz
t_sched=$(now)
wait_for default-serviceaccount 60 $KUBE kubectl --kubeconfig=$D/admin.kubeconfig get serviceaccount default -n default
t_sa=$(now)
python3 - $t0 $t_etcd $t_api $t_kcm $t_sched $t_sa <<PY
import sys
t=[float(x) for x in sys.argv[1:]]
for n,v in zip(["etcd healthy","apiserver /readyz","kcm /healthz","scheduler /healthz","default SA exists"],t[1:]):
    print(f"{n:22s} {v-t[0]:6.2f} s after start")
PY
