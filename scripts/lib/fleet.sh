# The fault suite's fleet, each part a host of its own on the private network of scripts/lib/netns.sh: three RabbitMQ
# nodes (one cluster, quorum queues, net_ticktime 5 s, pause_minority), a Redis master with a replica and three
# sentinels, a three-master Redis Cluster (and three replicas, started on demand), apns-sim, a slow relay in front
# of it, three worker hosts and a control host that enqueues and measures. Source after services.sh and netns.sh.
# shellcheck shell=bash

FLEET_SENTINEL_MASTER=apns

fleet_hosts() {
    netns_host rabbit1 11; netns_host rabbit2 12; netns_host rabbit3 13
    netns_host redis1 21; netns_host redis2 22
    netns_host sentinel1 31; netns_host sentinel2 32; netns_host sentinel3 33
    netns_host apns 41; netns_host relay 42
    netns_host w1 51; netns_host w2 52; netns_host w3 53
    netns_host rc1 61; netns_host rc2 62; netns_host rc3 63; netns_host rc4 64; netns_host rc5 65; netns_host rc6 66
    netns_host ctl 90
}

# The environment of RabbitMQ node N, for rabbitmq-server and rabbitmqctl run in its namespace.
fleet_rabbit_env() {
    local ip dir="$FLEET_DIR/rabbit$1"
    ip=$(netns_ip "rabbit$1")
    export HOME="$FLEET_DIR/erlang" RABBITMQ_NODENAME="rabbit@$ip" RABBITMQ_USE_LONGNAME=true
    export RABBITMQ_NODE_IP_ADDRESS="$ip" RABBITMQ_NODE_PORT=5672 RABBITMQ_DIST_PORT=25672
    export RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid"
    export RABBITMQ_CONFIG_FILE="$dir/rabbitmq" RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
    export PATH="/usr/lib/rabbitmq/bin:$PATH"
}

# rabbitmqctl against node N, from its own host.
fleet_ctl() { local node=$1; shift; ( fleet_rabbit_env "$node"; netns_run "rabbit$node" rabbitmqctl "$@" ); }

fleet_rabbit_start() {
    mkdir -p "$FLEET_DIR/erlang"
    head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$FLEET_DIR/erlang/.erlang.cookie"
    chmod 400 "$FLEET_DIR/erlang/.erlang.cookie"
    local node dir
    for node in 1 2 3; do
        dir="$FLEET_DIR/rabbit$node"
        mkdir -p "$dir/mnesia" "$dir/log"
        # pause_minority: a node cut off from the others stops serving (its clients move to the majority) until it
        # sees them again. net_ticktime 5: a silent node is given up by the others within 4-7 s, and with it its
        # consumers and the deliveries they held.
        cat > "$dir/rabbitmq.conf" <<CONF
listeners.tcp.default = $(netns_ip "rabbit$node"):5672
loopback_users = none
disk_free_limit.absolute = 50MB
cluster_partition_handling = pause_minority
CONF
        echo '[{kernel, [{net_ticktime, 5}]}, {rabbit, [{quorum_tick_interval, 200}]}].' > "$dir/advanced.config"
        echo '[].' > "$dir/enabled_plugins"
        : > "$dir/rabbitmq-env.conf"
        ( fleet_rabbit_env "$node"; netns_run "rabbit$node" rabbitmq-server -detached >"$dir/start.log" 2>&1 )
    done
}

fleet_rabbit_wait() {
    local node
    for node in 1 2 3; do
        local deadline=$((SECONDS + 90))
        until fleet_ctl "$node" await_startup >/dev/null 2>&1; do
            [ $SECONDS -lt $deadline ] || { log "RabbitMQ node $node did not start"; return 1; }
            sleep 0.5
        done
    done
    for node in 2 3; do
        fleet_ctl "$node" stop_app >/dev/null
        fleet_ctl "$node" join_cluster "rabbit@$(netns_ip rabbit1)" >/dev/null
        fleet_ctl "$node" start_app >/dev/null
    done
    log "fleet: RabbitMQ cluster of 3 nodes up"
}

# AMQP_URL for the three nodes.
fleet_amqp_url() {
    local node urls=""
    for node in 1 2 3; do urls="$urls${urls:+,}amqp://guest:guest@$(netns_ip "rabbit$node"):5672/%2f"; done
    echo "$urls"
}

fleet_redis_start() {
    local dir="$FLEET_DIR/redis" ip node
    mkdir -p "$dir"
    for node in 1 2; do
        ip=$(netns_ip "redis$node")
        local replica=()
        [ "$node" -eq 2 ] && replica=(--replicaof "$(netns_ip redis1)" 6379)
        netns_run "redis$node" redis-server --bind "$ip" --port 6379 --dir "$dir" --dbfilename "redis$node.rdb" \
            --save '' --appendonly no --databases 32 --protected-mode no "${replica[@]}" >"$dir/redis$node.log" 2>&1 &
    done
    for node in 1 2 3; do
        ip=$(netns_ip "sentinel$node")
        cat > "$dir/sentinel$node.conf" <<CONF
port 26379
protected-mode no
bind $ip
dir $dir
sentinel monitor $FLEET_SENTINEL_MASTER $(netns_ip redis1) 6379 2
sentinel down-after-milliseconds $FLEET_SENTINEL_MASTER 1000
sentinel failover-timeout $FLEET_SENTINEL_MASTER 3000
sentinel parallel-syncs $FLEET_SENTINEL_MASTER 1
CONF
        netns_run "sentinel$node" redis-server "$dir/sentinel$node.conf" --sentinel >"$dir/sentinel$node.log" 2>&1 &
    done
}

fleet_sentinels() {
    echo "$(netns_ip sentinel1):26379,$(netns_ip sentinel2):26379,$(netns_ip sentinel3):26379"
}

# The master the sentinels name now (host:port), asked of the first that answers.
fleet_sentinel_master() {
    local node reply
    for node in 1 2 3; do
        reply=$(netns_run ctl redis-cli -h "$(netns_ip "sentinel$node")" -p 26379 sentinel get-master-addr-by-name \
            "$FLEET_SENTINEL_MASTER" 2>/dev/null | tr '\n' ':' | sed 's/:$//')
        [ -n "$reply" ] && { echo "$reply"; return 0; }
    done
    return 1
}

# The Redis Cluster: masters rc1-rc3, and with `replicas` also rc4-rc6, one replica each.
fleet_cluster_start() {
    local dir="$FLEET_DIR/redis-cluster" node count=3 ip nodes=""
    [ "${1:-}" = replicas ] && count=6
    rm -rf "$dir"
    mkdir -p "$dir"
    for node in $(seq "$count"); do
        ip=$(netns_ip "rc$node")
        netns_run "rc$node" redis-server --bind "$ip" --port 6379 --dir "$dir" --cluster-enabled yes \
            --cluster-config-file "nodes-$node.conf" --cluster-node-timeout 2000 --cluster-require-full-coverage no --protected-mode no \
            --dbfilename "rc$node.rdb" --save '' --appendonly no >"$dir/rc$node.log" 2>&1 &
        nodes="$nodes $ip:6379"
    done
    local deadline=$((SECONDS + 60)) replicas=0
    [ "$count" -eq 6 ] && replicas=1
    # shellcheck disable=SC2086
    until netns_run ctl redis-cli --cluster create $nodes --cluster-replicas "$replicas" --cluster-yes \
            >"$dir/create.log" 2>&1; do
        [ $SECONDS -lt $deadline ] || { log "fleet: Redis Cluster create failed"; cat "$dir/create.log" >&2; return 1; }
        sleep 0.5
    done
    for node in $(seq "$count"); do
        until netns_run ctl redis-cli -h "$(netns_ip "rc$node")" cluster info 2>/dev/null | grep -q cluster_state:ok; do
            [ $SECONDS -lt $deadline ] || { log "fleet: Redis Cluster not ok"; return 1; }
            sleep 0.2
        done
    done
    FLEET_CLUSTER_NODES=$(echo "$nodes" | sed 's/^ //; s/ /,/g')
    log "fleet: Redis Cluster up ($count nodes)"
}

fleet_cluster_stop() {
    local node
    for node in 1 2 3 4 5 6; do
        for pid in $(ip netns pids "$NETNS_PREFIX-rc$node" 2>/dev/null); do kill -CONT "$pid"; kill -9 "$pid"; done
    done
}

# apns-sim on host apns, and a relay on host relay that holds every chunk RELAY_DELAY_MS each way.
fleet_apns_start() {
    local dead=("$@") arguments=() token
    for token in "${dead[@]}"; do arguments+=(--unregistered "$token"); done
    netns_run apns "$BUILD_DIR/apns-sim" --host "$(netns_ip apns)" --port 2197 --write-cert "$FLEET_DIR/apns.pem" \
        --cert-host "$(netns_ip apns)" --cert-host "$(netns_ip relay)" --count-distinct --threads 2 \
        --log-level warning "${arguments[@]}" >"$FLEET_DIR/apns-sim.log" 2>&1 &
    "$BUILD_DIR/apns-sim" --generate-key "$FLEET_DIR/key.p8" >/dev/null
    local deadline=$((SECONDS + 30))
    until fleet_sim_stats >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || { log "fleet: apns-sim did not start"; cat "$FLEET_DIR/apns-sim.log" >&2; return 1; }
        sleep 0.2
    done
}

fleet_relay_start() {
    netns_run relay python3 scripts/lib/delay-relay.py --listen "$(netns_ip relay):2197" \
        --to "$(netns_ip apns):2197" --delay-ms "$1" >"$FLEET_DIR/relay.log" 2>&1 &
    FLEET_RELAY_PID=$!
}

fleet_relay_stop() { [ -n "${FLEET_RELAY_PID:-}" ] && kill "$FLEET_RELAY_PID" 2>/dev/null; FLEET_RELAY_PID=""; }

# apns-sim's counters (JSON), asked from the control host.
fleet_sim_stats() {
    netns_run ctl curl -s --max-time 2 --http2 --cacert "$FLEET_DIR/apns.pem" "https://$(netns_ip apns):2197/sim/stats"
}

fleet_sim_outage() {
    netns_run ctl curl -s --max-time 2 --http2 --cacert "$FLEET_DIR/apns.pem" -X POST \
        "https://$(netns_ip apns):2197/sim/outage?seconds=$1" >/dev/null
}

# fleet_worker HOST LOG VAR=VALUE...: apns-worker run on HOST with the fleet's settings and the extra ones; prints
# its pid (ip execs env, which execs the worker: one process).
fleet_worker() {
    local host=$1 logfile=$2
    shift 2
    ip netns exec "$NETNS_PREFIX-$host" env AMQP_URL="$(fleet_amqp_url)" PUSH_QUEUE_TYPE=quorum \
        APNS_PRODUCTION_URL="https://$(netns_ip apns):2197" APNS_CA_FILE="$FLEET_DIR/apns.pem" \
        APNS_KEY_FILE="$FLEET_DIR/key.p8" APNS_KEY_ID=KEY0000001 APNS_TEAM_ID=TEAM000001 APNS_TOPIC=com.example.app \
        METRICS_HOST="$(netns_ip "$host")" METRICS_PORT=9090 LOG_LEVEL=info LOG_FORMAT=text "$@" \
        "$BUILD_DIR/apns-worker" run >"$logfile" 2>&1 &
    echo $!
}

# fleet_cleanup HOST LOG VAR=VALUE...: apns-worker cleanup on HOST; prints its pid.
fleet_cleanup() {
    local host=$1 logfile=$2
    shift 2
    ip netns exec "$NETNS_PREFIX-$host" env AMQP_URL="$(fleet_amqp_url)" PUSH_QUEUE_TYPE=quorum APNS_TOPIC=com.example.app \
        METRICS_PORT=0 LOG_LEVEL=info LOG_FORMAT=text "$@" "$BUILD_DIR/apns-worker" cleanup >"$logfile" 2>&1 &
    echo $!
}

# A worker's /metrics, asked from the control host.
fleet_metrics() { netns_run ctl curl -s --max-time 2 "http://$(netns_ip "$1"):9090/metrics"; }
