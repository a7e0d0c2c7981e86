# Redis with Sentinel on loopback ports, for the Sentinel tests and `scripts/demo --redis sentinel`: a master, one
# replica and three sentinels (quorum 2) watching them as master "apns". Source after scripts/lib/services.sh and
# call sentinel_start once services_start has made SERVICES_DIR (everything lives under it and stops with it), then
# sentinel_wait. Exports SENTINEL_NODES (host:port,host:port,host:port), SENTINEL_MASTER_NAME and SENTINEL_DIR,
# where each data node writes node-<port>.pid (so a test finds the master's process from the port the sentinels
# name) and `start-node PORT [args]` starts one again. Names outside REDIS_: apns-worker warns about unknown REDIS_
# variables in its environment.
# shellcheck shell=bash

sentinel_start() {
    SENTINEL_DIR="$SERVICES_DIR/sentinel"
    mkdir -p "$SENTINEL_DIR"
    # start-node PORT [redis-server arguments, such as --replicaof host port]: a data node of this setup, also for
    # a test that starts a killed node again.
    cat > "$SENTINEL_DIR/start-node" <<SCRIPT
#!/usr/bin/env bash
port=\$1
shift
exec redis-server --port "\$port" --bind 127.0.0.1 --dir "$SENTINEL_DIR" --dbfilename "node-\$port.rdb" --save '' \\
    --appendonly no --databases 32 --daemonize yes --pidfile "$SENTINEL_DIR/node-\$port.pid" \\
    --logfile "$SENTINEL_DIR/node-\$port.log" "\$@" >/dev/null
SCRIPT
    chmod +x "$SENTINEL_DIR/start-node"
    local master replica nodes="" index port
    master=$(free_port)
    replica=$(free_port)
    "$SENTINEL_DIR/start-node" "$master"
    "$SENTINEL_DIR/start-node" "$replica" --replicaof 127.0.0.1 "$master"
    for index in 1 2 3; do
        port=$(free_port)
        # down-after 1 s (production default: 30 s): the tests see a whole failover in a few seconds.
        cat > "$SENTINEL_DIR/sentinel$index.conf" <<CONF
port $port
bind 127.0.0.1
daemonize yes
pidfile $SENTINEL_DIR/sentinel$index.pid
logfile $SENTINEL_DIR/sentinel$index.log
dir $SENTINEL_DIR
sentinel monitor apns 127.0.0.1 $master 2
sentinel down-after-milliseconds apns 1000
sentinel failover-timeout apns 10000
sentinel parallel-syncs apns 1
CONF
        redis-server "$SENTINEL_DIR/sentinel$index.conf" --sentinel >/dev/null
        nodes="$nodes${nodes:+,}127.0.0.1:$port"
    done
    export SENTINEL_NODES="$nodes" SENTINEL_MASTER_NAME=apns SENTINEL_DIR
    log "Redis Sentinel under $SENTINEL_DIR: master on $master, replica on $replica, sentinels $nodes (starting)"
}

# Waits until the replica has synchronised and every sentinel sees the replica and the two other sentinels.
sentinel_wait() {
    wait_for_redis_nodes "Redis Sentinel" "$SENTINEL_NODES" "$SENTINEL_DIR" sentinel_ready $((SECONDS + 60))
}

sentinel_ready() {
    redis-cli -p "$1" sentinel master apns 2>/dev/null | tr '\n' ' ' | grep -q "num-slaves 1 .*num-other-sentinels 2"
}

sentinel_stop() { kill_pidfiles "${SENTINEL_DIR:-}"; }
