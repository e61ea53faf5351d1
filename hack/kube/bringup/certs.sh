#!/bin/bash
# Hand bring-up used to prove and measure the real control plane (docs/dev/kube-real-plane.md);
# not used by make run or the tests yet (issue 21 wires the control plane into localcluster).
# Makes the PKI of a local control plane in $1 (openssl). Everything is signed by one CA.
set -euo pipefail
D=$1; mkdir -p "$D/pki"; cd "$D/pki"
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
openssl req -x509 -new -key ca.key -subj "/CN=scalable-topics-local-ca" -days 3650 -out ca.crt \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
# name CN O ext-usage SANs
leaf() {
  local name=$1 subj=$2 usage=$3 san=${4:-}
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $name.key 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } > $name.ext
  openssl req -new -key $name.key -subj "$subj" -out $name.csr
  openssl x509 -req -in $name.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile $name.ext -out $name.crt 2>/dev/null
  rm $name.csr $name.ext
}
leaf etcd-server "/CN=etcd-server" serverAuth "IP:127.0.0.1,DNS:localhost"
leaf apiserver-etcd-client "/CN=kube-apiserver-etcd-client" clientAuth
leaf apiserver "/CN=kube-apiserver" serverAuth "IP:127.0.0.1,IP:$SVC_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
leaf admin "/O=system:masters/CN=kubernetes-admin" clientAuth
leaf controller-manager "/CN=system:kube-controller-manager" clientAuth
leaf scheduler "/CN=system:kube-scheduler" clientAuth
# service-account token signing key (RSA: the apiserver's default JWT alg is RS256)
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
openssl pkey -in sa.key -pubout -out sa.pub
chmod 600 *.key
