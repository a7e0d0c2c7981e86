# A three-node RabbitMQ cluster on loopback ports, for the failover tests and `scripts/demo --cluster`. Source after
# scripts/lib/services.sh and call cluster_start once services_start has made SERVICES_DIR (the cluster lives under
# it and stops with it). Nodes share one epmd and one Erlang cookie; each has its own name, AMQP and distribution
# ports, data and log directories. cluster_wait returns once all three have joined.
# shellcheck shell=bash

# The environment rabbitmq-server and rabbitmqctl need for node N (1..3).
cluster_node_env() {
    local node=$1 dir="$SERVICES_DIR/cluster/node$1"
    rabbitmq_node_env "$SERVICES_DIR/cluster/home" "apnsw$node-$$@localhost" "${CLUSTER_PORTS[$((node - 1))]}" \
        "${CLUSTER_DIST_PORTS[$((node - 1))]}" "$CLUSTER_EPMD" "$dir"
    export RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
    # Schedulers that sleep when idle: three nodes waiting for their phase leave the two cores to the other tests.
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
}

cluster_start() {
    CLUSTER_PORTS=("$(free_port)" "$(free_port)" "$(free_port)")
    CLUSTER_DIST_PORTS=("$(free_port)" "$(free_port)" "$(free_port)")
    CLUSTER_EPMD=$(free_port)
    mkdir -p "$SERVICES_DIR/cluster/home"
    # One cookie for the three nodes and rabbitmqctl: Erlang distribution trusts what shares it.
    head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SERVICES_DIR/cluster/home/.erlang.cookie"
    chmod 400 "$SERVICES_DIR/cluster/home/.erlang.cookie"
    local node
    for node in 1 2 3; do
        local dir="$SERVICES_DIR/cluster/node$node"
        mkdir -p "$dir/mnesia" "$dir/log"
        # autoheal: once a node the others gave up (cut off, or frozen and thawed) is back, the partition is healed
        # by restarting the smaller side; see docs/high-availability.md, Clustered RabbitMQ.
        cat > "$dir/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:${CLUSTER_PORTS[$((node - 1))]}
loopback_users = none
disk_free_limit.absolute = 50MB
cluster_partition_handling = autoheal
CONF
        # quorum_tick_interval: the quorum queue counts that tests read refresh every 200 ms instead of every 5 s.
        # net_ticktime 5 (60 by default): a node that stops answering is given up by the others within 4-7 s, and
        # with it its consumers and the deliveries they held (see docs/high-availability.md, Clustered RabbitMQ).
        echo '[{kernel, [{net_ticktime, 5}]}, {rabbit, [{quorum_tick_interval, 200}]}].' > "$dir/advanced.config"
        echo '[].' > "$dir/enabled_plugins"
        : > "$dir/rabbitmq-env.conf"
    done
    # epmd first: rabbitmqctl would start one of its own otherwise.
    epmd -port "$CLUSTER_EPMD" -daemon
    for node in 1 2 3; do
        ( cluster_node_env "$node"; rabbitmq-server -detached >"$SERVICES_DIR/cluster/node$node/start.log" 2>&1 )
    done
    # rabbitmqctl for node N: `$CLUSTER_CTL N stop_app`.
    cat > "$SERVICES_DIR/cluster/rabbitmqctl" <<WRAPPER
#!/usr/bin/env bash
node=\$1; shift
export HOME="$SERVICES_DIR/cluster/home" RABBITMQ_NODENAME="apnsw\$node-$$@localhost" ERL_EPMD_PORT="$CLUSTER_EPMD"
export RABBITMQ_CONF_ENV_FILE="$SERVICES_DIR/cluster/node\$node/rabbitmq-env.conf" PATH="/usr/lib/rabbitmq/bin:\$PATH"
exec rabbitmqctl "\$@"
WRAPPER
    chmod +x "$SERVICES_DIR/cluster/rabbitmqctl"
    export CLUSTER_CTL="$SERVICES_DIR/cluster/rabbitmqctl"
    export CLUSTER_NODE_NAMES="apnsw1-$$@localhost,apnsw2-$$@localhost,apnsw3-$$@localhost"
    export CLUSTER_AMQP_URL="amqp://guest:guest@127.0.0.1:${CLUSTER_PORTS[0]}/%2f,amqp://guest:guest@127.0.0.1:${CLUSTER_PORTS[1]}/%2f,amqp://guest:guest@127.0.0.1:${CLUSTER_PORTS[2]}/%2f"
    log "cluster under $SERVICES_DIR/cluster: RabbitMQ nodes on ${CLUSTER_PORTS[*]} (starting)"
}

# Waits for the three nodes, then joins nodes 2 and 3 to node 1.
cluster_wait() {
    local node
    for node in 1 2 3; do
        local deadline=$((SECONDS + 90))
        until "$CLUSTER_CTL" "$node" await_startup >"$SERVICES_DIR/cluster/node$node/await.log" 2>&1; do
            if [ $SECONDS -ge $deadline ]; then
                log "cluster node $node did not start:"
                cat "$SERVICES_DIR/cluster/node$node/start.log" "$SERVICES_DIR/cluster/node$node/await.log" >&2
                tail -n 40 "$SERVICES_DIR/cluster/node$node/log/"*.log >&2 2>/dev/null
                return 1
            fi
            sleep 0.5
        done
    done
    for node in 2 3; do
        "$CLUSTER_CTL" "$node" stop_app >/dev/null
        "$CLUSTER_CTL" "$node" join_cluster "apnsw1-$$@localhost" >/dev/null
        "$CLUSTER_CTL" "$node" start_app >/dev/null
    done
    local members
    members=$("$CLUSTER_CTL" 1 cluster_status --formatter json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))')
    [ "$members" = 3 ] || { log "the cluster has $members running nodes, not 3"; return 1; }
    log "cluster of 3 nodes up"
}

cluster_stop() {
    [ -n "${CLUSTER_CTL:-}" ] || return 0
    # Every node's command line names the cluster's home; the epmd is ours by its private port.
    pkill -f -- "-home $SERVICES_DIR/cluster/home" 2>/dev/null || true
    [ -n "${CLUSTER_EPMD:-}" ] && { pkill -f -- "epmd -port $CLUSTER_EPMD" 2>/dev/null || true; }
    CLUSTER_CTL=""
}
