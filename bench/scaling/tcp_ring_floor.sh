#!/usr/bin/env bash
# tcp_ring_floor.sh G [MTU] — the floor of a ring all-reduce on the shaped
# links of netns_scaling.sh, without halka: G namespaces on one bridge, every
# link tbf 1gbit burst 250000 latency 20ms in both directions (the script's
# defaults), and every host sends 2(G-1)/G · 64 MiB over one plain TCP
# connection to its successor while receiving as much from its predecessor
# (tcp_goodput.py). Prints the slowest host's time and the bound
# 2(G-1)/G · S/R. Root; namespaces "hr<pid>-*", 198.18.2.0/24, removed on
# exit; every process bounded by timeout 60.
set -u
G=${1:?usage: tcp_ring_floor.sh G [MTU]}; MTU=${2:-1500}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
P="hr$$-"; SW="${P}sw"; RATE=1gbit; BURST=250000; LAT=20ms
N=$(( 2 * (G - 1) * (64 << 20) / G ))
TMP=$(mktemp -d)
MADE=()
cleanup() {
  local ns
  for ns in "${MADE[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf -- "$TMP"
}
trap cleanup EXIT
ip netns add "$SW" && MADE+=("$SW") || exit 2
ip -n "$SW" link add br0 type bridge && ip -n "$SW" link set br0 up || exit 2
for (( i = 0; i < G; i++ )); do
  ns="${P}h$i"
  ip netns add "$ns" && MADE+=("$ns") || exit 2
  ip -n "$SW" link add "h$i" type veth peer name eth0 netns "$ns" || exit 2
  ip -n "$SW" link set "h$i" master br0
  ip -n "$SW" link set "h$i" mtu "$MTU" up
  ip -n "$ns" link set eth0 mtu "$MTU"
  ip -n "$ns" addr add "198.18.2.$(( 10 + i ))/24" dev eth0
  ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up
  ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate $RATE burst $BURST latency $LAT
  ip netns exec "$SW" tc qdisc replace dev "h$i" root tbf rate $RATE burst $BURST latency $LAT
done
for (( i = 0; i < G; i++ )); do
  timeout 60 ip netns exec "${P}h$i" python3 "$HERE/tcp_goodput.py" server 5001 "$N" >"$TMP/s$i" &
done
sleep 0.5
for (( i = 0; i < G; i++ )); do
  timeout 60 ip netns exec "${P}h$i" python3 "$HERE/tcp_goodput.py" client \
    "198.18.2.$(( 10 + (i + 1) % G ))" 5001 "$N" >"$TMP/c$i" &
done
wait
echo "G=$G mtu=$MTU bytes/host=$N bound_s=$(awk -v n="$N" 'BEGIN { printf "%.4f", n / 125e6 }') load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "slowest sender:   $(sort -k6 -n "$TMP"/c* | tail -1)"
echo "slowest receiver: $(sort -k5 -n "$TMP"/s* | tail -1)"
