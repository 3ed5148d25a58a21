# netns.sh — hosts of their own for system tests: network namespaces on one
# bridge (in a "switch" namespace of its own), 198.18.0.0/15 addresses.
# Source after lib.sh; set P (a short unique prefix) first.
#
#   netns_switch            make ${P}sw with bridge br0 (skips with 77 if the
#                           kernel or the permissions do not allow it)
#   netns_make_switch       the same without the checks (returns 1 on failure)
#   netns_add_host S ADDR   namespace ${P}S, eth0=ADDR/24 on br0
#   netns_start_workers TAG MODE JOB [FLAG...]  a job's G workers on the hosts
#   netns_cleanup           stop this test's processes, remove its namespaces
# NETNS_MADE lists the namespaces this test created (removed by id).

NETNS_MADE=()

netns_skip() { echo "SKIP: needs root, ip netns, veth and a bridge ($*)"; exit 77; }

# Every process group this test started (by recorded PID): TERM, then KILL.
netns_kill_mine() {
  local name pid i any
  for name in "${SYS_NAMES[@]}"; do
    pid=${SYS_PID[$name]}
    pid_alive "$pid" && { kill -CONT -- "-$pid" 2>/dev/null; kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null; }
  done
  for i in $(seq 1 100); do
    any=0
    for name in "${SYS_NAMES[@]}"; do pid_alive "${SYS_PID[$name]}" && any=1; done
    (( any )) || break
    sleep 0.02
  done
  for name in "${SYS_NAMES[@]}"; do
    pid=${SYS_PID[$name]}
    pid_alive "$pid" && { kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; }
  done
}

netns_del_all() {
  local ns i
  for ns in "${NETNS_MADE[@]}"; do
    for i in 1 2 3 4 5; do
      ip netns del "$ns" 2>/dev/null
      ip netns list 2>/dev/null | grep -qw -- "$ns" || break
      sleep 0.2
    done
    ip netns list 2>/dev/null | grep -qw -- "$ns" && echo "cleanup: could not remove netns $ns" >&2
  done
  NETNS_MADE=()
}

netns_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  netns_kill_mine
  netns_del_all
  (exit "$rc"); cleanup   # lib.sh: logs, exit status
}

# Call after sys_init: installs netns_cleanup and builds the switch.
netns_switch() {
  (( EUID == 0 )) || netns_skip "not root"
  command -v ip >/dev/null 2>&1 || netns_skip "no ip command"
  trap netns_cleanup EXIT
  trap 'SYS_FAILED=1; echo "interrupted" >&2; exit 130' INT TERM
  local probe="${P}probe"
  ip netns add "$probe" >/dev/null 2>&1 || netns_skip "'ip netns add' failed"
  ip netns del "$probe" >/dev/null 2>&1
  SW="${P}sw"
  netns_make_switch || netns_skip "cannot create namespace $SW with a bridge"
}

# The switch namespace ${P}sw (SW) with bridge br0, no firewall on bridged
# frames. Returns 1 on failure (the caller decides: skip or die).
netns_make_switch() {
  SW="${P}sw"
  ip netns add "$SW" || return 1
  NETNS_MADE+=("$SW")
  ip netns exec "$SW" sysctl -qw net.bridge.bridge-nf-call-iptables=0 \
    net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-arptables=0 \
    >/dev/null 2>&1 || true
  ip -n "$SW" link add name br0 type bridge || return 1
  ip -n "$SW" link set dev br0 type bridge stp_state 0 forward_delay 0 2>/dev/null || true
  ip -n "$SW" link set dev br0 type bridge nf_call_iptables 0 nf_call_ip6tables 0 \
    nf_call_arptables 0 2>/dev/null || true
  ip -n "$SW" link set dev br0 up || return 1
  ip -n "$SW" link set dev lo up 2>/dev/null || true
}

netns_cap_host() {  # netns_cap_host SHORT RATE: tbf on the host's link, both ways
  ip netns exec "${P}$1" tc qdisc replace dev eth0 root tbf rate "$2" \
    burst 256kb latency 400ms || return 1
  ip netns exec "$SW" tc qdisc replace dev "h$1" root tbf rate "$2" \
    burst 256kb latency 400ms || return 1
}

# netns_start_workers TAG MODE JOB [FLAG...]: G workers of job JOB, rank r
# named TAG.wR in host host_of(r)'s namespace ${P}hH, listening on
# addr_host(H):port_of(r) (the caller defines G, RDV_ADDR, WORKER_BIN and
# those three functions). MODE "own": each names a host of its own
# (--host_id), so the ring keeps rank order; "default": they name their
# namespace's host. FLAGs go to every worker.
netns_start_workers() {
  local tag=$1 mode=$2 job=$3 r h extra
  shift 3
  for (( r = 0; r < G; ++r )); do
    h=$(host_of "$r")
    extra=()
    [[ $mode == own ]] && extra=(--host_id="$tag-w$r")
    start_daemon "$tag.w$r" ip netns exec "${P}h$h" "$WORKER_BIN" \
      --rendezvous="$RDV_ADDR" --job="$job" --world_size="$G" --worker_id="w$r" \
      --rank="$r" --listen="$(addr_host "$h"):$(port_of "$r")" "${extra[@]}" "$@"
  done
}

netns_add_host() {  # netns_add_host SHORT ADDR
  local addr=$2 ns="${P}$1" hv="h$1"
  ip netns add "$ns" || return 1
  NETNS_MADE+=("$ns")
  ip -n "$SW" link add "$hv" type veth peer name eth0 netns "$ns" || return 1
  ip -n "$SW" link set "$hv" master br0 || return 1
  ip -n "$SW" link set "$hv" up || return 1
  ip -n "$ns" addr add "$addr/24" dev eth0 || return 1
  ip -n "$ns" link set eth0 up || return 1
  ip -n "$ns" link set lo up || return 1
}
