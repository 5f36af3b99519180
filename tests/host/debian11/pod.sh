#!/bin/sh
# A pod, made as the kubelet makes one after a boot: a new sandbox (its own
# network namespace, a new container id), wired by the real flannel CNI
# plugin, which reads /run/flannel/subnet.env (edgevx writes it) and
# delegates to the bridge plugin with host-local, as kube-flannel's CNI
# config has it. Installed into the Debian 11 guest by
# `cargo xtask test --host debian11` (xtask/src/test/host/debian11.rs).
set -eu
id=$(tr -d - < /proc/sys/kernel/random/boot_id)
ip netns delete pod 2>/dev/null || true
ip netns add pod
ip -n pod link set lo up
echo '{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}}' |
  CNI_COMMAND=ADD CNI_CONTAINERID="$id" CNI_NETNS=/run/netns/pod CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni \
  /usr/lib/cni/flannel > /run/edgevx-test-pod.json
cat /run/edgevx-test-pod.json
