# A private network for fault tests: one network namespace per host, each with one address on a bridge that lives in a
# namespace of its own, where nftables rules cut any path between two hosts (packets dropped both ways, no RST: a
# true black hole). Nothing touches the machine's own network: only addresses inside these namespaces are used.
# Source it (root required), call netns_start, then netns_host for each host; netns_stop runs on exit.
# shellcheck shell=bash

NETNS_PREFIX="apnsw-fx$$"
NETNS_SUBNET="10.77.0"
NETNS_HOSTS=()

# The bridge and the rules' table. The bridge forwards at once (no STP, no forwarding delay).
netns_start() {
    command -v nft >/dev/null || { log "nft not found (apt-get install nftables)"; return 1; }
    [ "$(id -u)" -eq 0 ] || { log "network namespaces need root"; return 1; }
    ip netns add "$NETNS_PREFIX-br"
    ip netns exec "$NETNS_PREFIX-br" ip link set lo up
    ip netns exec "$NETNS_PREFIX-br" ip link add br0 type bridge forward_delay 0 stp_state 0
    ip netns exec "$NETNS_PREFIX-br" ip link set br0 up
    ip netns exec "$NETNS_PREFIX-br" nft add table bridge faults
    ip netns exec "$NETNS_PREFIX-br" nft add chain bridge faults cuts '{ type filter hook forward priority 0; }'
}

# netns_host NAME LAST_OCTET: a host at 10.77.0.LAST_OCTET, its loopback up (its own 127/8).
netns_host() {
    local name=$1 address="$NETNS_SUBNET.$2" index=${#NETNS_HOSTS[@]}
    local namespace="$NETNS_PREFIX-$name" inside="fx$$h$index" outside="fx$$b$index"
    ip netns add "$namespace"
    ip link add "$inside" type veth peer name "$outside"
    ip link set "$inside" netns "$namespace"
    ip link set "$outside" netns "$NETNS_PREFIX-br"
    ip netns exec "$NETNS_PREFIX-br" ip link set "$outside" master br0
    ip netns exec "$NETNS_PREFIX-br" ip link set "$outside" up
    ip netns exec "$namespace" ip addr add "$address/24" dev "$inside"
    ip netns exec "$namespace" ip link set "$inside" up
    ip netns exec "$namespace" ip link set lo up
    NETNS_HOSTS+=("$name")
    eval "NETNS_IP_${name//-/_}=$address"
}

# The address of a host.
netns_ip() { local variable="NETNS_IP_${1//-/_}"; echo "${!variable}"; }

# netns_run HOST COMMAND...: runs COMMAND inside HOST's namespace.
netns_run() { local host=$1; shift; ip netns exec "$NETNS_PREFIX-$host" "$@"; }

# netns_cut A B: packets between hosts A and B are dropped, both ways. B may be a list of hosts.
netns_cut() {
    local from=$1 to
    shift
    for to in "$@"; do
        local a b
        a=$(netns_ip "$from") b=$(netns_ip "$to")
        ip netns exec "$NETNS_PREFIX-br" nft add rule bridge faults cuts ip saddr "$a" ip daddr "$b" drop
        ip netns exec "$NETNS_PREFIX-br" nft add rule bridge faults cuts ip saddr "$b" ip daddr "$a" drop
    done
}

# netns_cut_flow A B PORT: only the packets of A's TCP connections to B's PORT that exist now (by their source ports,
# as A's socket table lists them) are dropped, both ways: those connections are black-holed, new ones go through.
netns_cut_flow() {
    local a b port=$3 sport
    a=$(netns_ip "$1") b=$(netns_ip "$2")
    for sport in $(netns_run "$1" ss -Htn state established dst "$b:$port" | awk '{print $3}' | sed 's/.*://'); do
        ip netns exec "$NETNS_PREFIX-br" nft add rule bridge faults cuts ip saddr "$a" ip daddr "$b" tcp sport "$sport" drop
        ip netns exec "$NETNS_PREFIX-br" nft add rule bridge faults cuts ip saddr "$b" ip daddr "$a" tcp dport "$sport" drop
    done
}

# Every cut healed.
netns_heal() { ip netns exec "$NETNS_PREFIX-br" nft flush chain bridge faults cuts; }

# Every process in the namespaces killed, the namespaces and their links gone.
netns_stop() {
    local host pid
    for host in "${NETNS_HOSTS[@]}" br; do
        for pid in $(ip netns pids "$NETNS_PREFIX-$host" 2>/dev/null); do kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null; done
        ip netns del "$NETNS_PREFIX-$host" 2>/dev/null
    done
    NETNS_HOSTS=()
}
