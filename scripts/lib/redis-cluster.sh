# A three-master Redis Cluster on loopback ports, for the Redis Cluster tests and `scripts/demo --redis cluster`.
# Source after scripts/lib/services.sh and call redis_cluster_start once services_start has made SERVICES_DIR
# (everything lives under it and stops with it), then redis_cluster_wait. Exports CLUSTER_REDIS_NODES
# (host:port,host:port,host:port) and CLUSTER_REDIS_DIR, where each node writes node-<port>.pid and
# `start-node PORT [args]` starts one; and CLUSTER_REDIS_TLS_NODES, a second three-master cluster that speaks TLS only
# (clients and the cluster bus), with the certificates services_start made. Names outside REDIS_: apns-worker warns
# about unknown REDIS_ variables.
# shellcheck shell=bash

# A free port whose cluster bus port (port + 10000) is free too.
redis_cluster_port() {
    free_port 10000
}

redis_cluster_start() {
    CLUSTER_REDIS_DIR="$SERVICES_DIR/redis-cluster"
    mkdir -p "$CLUSTER_REDIS_DIR"
    cat > "$CLUSTER_REDIS_DIR/start-node" <<SCRIPT
#!/usr/bin/env bash
port=\$1
shift
exec redis-server --port "\$port" --bind 127.0.0.1 --dir "$CLUSTER_REDIS_DIR" --cluster-enabled yes \\
    --cluster-config-file "nodes-\$port.conf" --cluster-node-timeout 2000 --dbfilename "node-\$port.rdb" --save '' \\
    --appendonly no --daemonize yes --pidfile "$CLUSTER_REDIS_DIR/node-\$port.pid" \\
    --logfile "$CLUSTER_REDIS_DIR/node-\$port.log" "\$@" >/dev/null 2>&1
SCRIPT
    chmod +x "$CLUSTER_REDIS_DIR/start-node"
    local nodes="" port
    for _ in 1 2 3; do
        port=$(redis_cluster_port)
        "$CLUSTER_REDIS_DIR/start-node" "$port"
        nodes="$nodes${nodes:+,}127.0.0.1:$port"
    done
    export CLUSTER_REDIS_NODES="$nodes" CLUSTER_REDIS_DIR
    local tls="$SERVICES_DIR/rabbitmq/tls" secure=""
    for _ in 1 2 3; do
        port=$(redis_cluster_port)
        "$CLUSTER_REDIS_DIR/start-node" "$port" --port 0 --tls-port "$port" --tls-cluster yes --tls-replication yes \
            --tls-cert-file "$tls/server.pem" --tls-key-file "$tls/server.key" --tls-ca-cert-file "$tls/ca.pem" \
            --tls-auth-clients no
        secure="$secure${secure:+,}127.0.0.1:$port"
    done
    export CLUSTER_REDIS_TLS_NODES="$secure"
    log "Redis Cluster under $CLUSTER_REDIS_DIR: masters $nodes, and over TLS $secure (starting)"
}

# Assigns the slots (redis-cli --cluster create) and waits until every node says cluster_state:ok, for both clusters.
redis_cluster_wait() {
    local deadline=$((SECONDS + 60))
    REDIS_CLI_TLS=()
    redis_cluster_create "$CLUSTER_REDIS_NODES" "$deadline" || return 1
    wait_for_redis_nodes "Redis Cluster" "$CLUSTER_REDIS_NODES" "$CLUSTER_REDIS_DIR" redis_cluster_node_ready "$deadline" \
        || return 1
    REDIS_CLI_TLS=(--tls --cacert "$SERVICES_DIR/rabbitmq/tls/ca.pem")
    redis_cluster_create "$CLUSTER_REDIS_TLS_NODES" "$deadline" || return 1
    wait_for_redis_nodes "Redis Cluster over TLS" "$CLUSTER_REDIS_TLS_NODES" "$CLUSTER_REDIS_DIR" redis_cluster_node_ready \
        "$deadline"
}

# redis_cluster_create NODES DEADLINE, with REDIS_CLI_TLS's options.
redis_cluster_create() {
    # shellcheck disable=SC2086
    until redis-cli "${REDIS_CLI_TLS[@]}" --cluster create ${1//,/ } --cluster-replicas 0 --cluster-yes \
            > "$CLUSTER_REDIS_DIR/create.log" 2>&1; do
        [ $SECONDS -lt "$2" ] || { log "Redis Cluster: create failed"; cat "$CLUSTER_REDIS_DIR/create.log" >&2; return 1; }
        sleep 0.2
    done
}

redis_cluster_node_ready() {
    redis-cli "${REDIS_CLI_TLS[@]}" -p "$1" cluster info 2>/dev/null | grep -q "cluster_state:ok"
}

redis_cluster_stop() { kill_pidfiles "${CLUSTER_REDIS_DIR:-}"; }
