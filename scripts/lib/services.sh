# Shared by scripts/test, scripts/demo and scripts/bench: installs what is missing and runs private RabbitMQ,
# Redis and apns-sim instances on free loopback ports under one temporary directory. Source it, then call
# services_start; services_stop runs on exit (also on failure and Ctrl-C).
# shellcheck shell=bash

# python3-yaml and systemd: the checkers DeploymentTests uses on deploy/ (YAML, systemd-analyze verify).
SERVICES_PACKAGES="openssl librabbitmq-dev libnghttp2-dev libssl-dev libmimalloc-dev rabbitmq-server redis-server nghttp2-client nghttp2-server amqp-tools python3-yaml systemd curl prometheus python3-jsonschema tzdata python3-pika golang-go golang-github-rabbitmq-amqp091-go-dev"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

services_install() {
    local missing=()
    for package in $SERVICES_PACKAGES; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# A loopback port nothing listens on, below the kernel's ephemeral range: a port the kernel hands out for bind(0) or
# an outgoing connection can be taken by any client (rabbitmqctl, epmd, a test) in the tens of seconds before a
# booting node binds it. Ports handed out under SERVICES_DIR are remembered, so that one run never gets one twice.
# `free_port OFFSET`: a port P such that P + OFFSET is free too (a Redis Cluster node's bus port).
free_port() {
    python3 - "${SERVICES_DIR:+$SERVICES_DIR/ports-handed-out}" "${1:-0}" <<'PY'
import os, random, socket, sys
record, offset = sys.argv[1], int(sys.argv[2])
with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
    ephemeral_low = int(ranges.read().split()[0])
taken = set()
if record and os.path.exists(record):
    with open(record) as handed_out:
        taken = set(handed_out.read().split())

def free(port):
    if str(port) in taken:
        return False
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()

for _ in range(1000):
    port = random.randrange(10000, ephemeral_low - offset)
    wanted = {port, port + offset}
    if all(free(each) for each in wanted):
        if record:
            with open(record, "a") as handed_out:
                handed_out.writelines(f"{each}\n" for each in wanted)
        print(port)
        sys.exit(0)
sys.exit("no free loopback port below the ephemeral range")
PY
}

# The environment rabbitmq-server and rabbitmqctl need for an isolated node: HOME (its Erlang cookie), node name,
# AMQP, distribution and epmd ports, and DIR holding its data, logs and configuration files.
rabbitmq_node_env() {
    local home=$1 name=$2 port=$3 dist=$4 epmd=$5 dir=$6
    export HOME="$home"
    export RABBITMQ_NODENAME="$name"
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT="$port"
    export RABBITMQ_DIST_PORT="$dist"
    export ERL_EPMD_PORT="$epmd"
    export RABBITMQ_MNESIA_BASE="$dir/mnesia"
    export RABBITMQ_LOG_BASE="$dir/log"
    export RABBITMQ_PID_FILE="$dir/pid"
    export RABBITMQ_CONFIG_FILE="$dir/rabbitmq"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
    export RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
    export PATH="/usr/lib/rabbitmq/bin:$PATH"
}

services_rabbitmq_env() {
    rabbitmq_node_env "$SERVICES_DIR/rabbitmq-home" "apnsw-$$@localhost" "$RABBITMQ_PORT" "$RABBITMQ_DIST" \
        "$RABBITMQ_EPMD" "$SERVICES_DIR/rabbitmq"
}

# Starts RabbitMQ in the background (it takes ~5 s; call services_wait_rabbitmq later) and Redis at once.
services_start() {
    SERVICES_DIR=$(mktemp -d /tmp/apns-worker-services.XXXXXX)
    export SERVICES_DIR
    trap services_stop EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    RABBITMQ_PORT=$(free_port); RABBITMQ_DIST=$(free_port); RABBITMQ_EPMD=$(free_port); REDIS_PORT=$(free_port)
    mkdir -p "$SERVICES_DIR/rabbitmq-home" "$SERVICES_DIR/rabbitmq/mnesia" "$SERVICES_DIR/rabbitmq/log" "$SERVICES_DIR/redis"
    RABBITMQ_TLS_PORT=$(free_port)
    # The broker's own metrics (rabbitmq_prometheus), for the test that scrapes it beside the workers.
    RABBITMQ_PROMETHEUS_PORT=$(free_port)
    # A private CA and a server certificate for localhost, so that amqps:// is tested for real.
    local tls="$SERVICES_DIR/rabbitmq/tls"
    mkdir -p "$tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=apns-worker test CA" \
        -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
        -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$tls/san.ext"
    openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
        -extfile "$tls/san.ext" -out "$tls/server.pem" 2>/dev/null
    # A client certificate from the same CA, for the Redis below that requires one.
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=apns-worker" \
        -keyout "$tls/client.key" -out "$tls/client.csr" 2>/dev/null
    openssl x509 -req -in "$tls/client.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
        -out "$tls/client.pem" 2>/dev/null
    chmod 644 "$tls"/*
    cat > "$SERVICES_DIR/rabbitmq/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$RABBITMQ_PORT
listeners.ssl.default = 127.0.0.1:$RABBITMQ_TLS_PORT
ssl_options.cacertfile = $tls/ca.pem
ssl_options.certfile = $tls/server.pem
ssl_options.keyfile = $tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
loopback_users = none
disk_free_limit.absolute = 50MB
prometheus.tcp.ip = 127.0.0.1
prometheus.tcp.port = $RABBITMQ_PROMETHEUS_PORT
CONF
    echo '[rabbitmq_prometheus].' > "$SERVICES_DIR/rabbitmq/enabled_plugins"
    : > "$SERVICES_DIR/rabbitmq/rabbitmq-env.conf"
    # SERVICES_BROKER_CPUS (scripts/bench): the cores the broker runs on. Set at its start, so that Erlang brings as
    # many schedulers online as those cores.
    (
        services_rabbitmq_env
        ${SERVICES_BROKER_CPUS:+taskset -c "$SERVICES_BROKER_CPUS"} rabbitmq-server -detached \
            >"$SERVICES_DIR/rabbitmq/start.log" 2>&1
    )
    # 32 databases: tests that need a Redis of their own (the fleet's invalidation window, a rate limit) each take one.
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$SERVICES_DIR/redis" --save '' --appendonly no \
        --databases 32 --daemonize yes --pidfile "$SERVICES_DIR/redis/pid" --logfile "$SERVICES_DIR/redis/log" >/dev/null
    # And a Redis that speaks TLS only, with the same CA, requiring a client certificate, so that rediss:// is tested
    # for real.
    REDIS_TLS_PORT=$(free_port)
    mkdir -p "$SERVICES_DIR/redis-tls"
    redis-server --port 0 --tls-port "$REDIS_TLS_PORT" --bind 127.0.0.1 --tls-cert-file "$tls/server.pem" \
        --tls-key-file "$tls/server.key" --tls-ca-cert-file "$tls/ca.pem" --tls-auth-clients yes \
        --dir "$SERVICES_DIR/redis-tls" --save '' --appendonly no --daemonize yes \
        --pidfile "$SERVICES_DIR/redis-tls/pid" --logfile "$SERVICES_DIR/redis-tls/log" >/dev/null
    # rabbitmqctl for this node, for tests that act on the broker (closing one connection, listing queues).
    cat > "$SERVICES_DIR/rabbitmqctl" <<WRAPPER
#!/usr/bin/env bash
export HOME="$SERVICES_DIR/rabbitmq-home" RABBITMQ_NODENAME="apnsw-$$@localhost" ERL_EPMD_PORT="$RABBITMQ_EPMD"
export RABBITMQ_CONF_ENV_FILE="$SERVICES_DIR/rabbitmq/rabbitmq-env.conf" PATH="/usr/lib/rabbitmq/bin:\$PATH"
exec rabbitmqctl "\$@"
WRAPPER
    chmod +x "$SERVICES_DIR/rabbitmqctl"
    export RABBITMQCTL="$SERVICES_DIR/rabbitmqctl"
    export AMQP_URL="amqp://guest:guest@127.0.0.1:$RABBITMQ_PORT/%2f"
    export AMQPS_URL="amqps://guest:guest@localhost:$RABBITMQ_TLS_PORT/%2f" AMQPS_CA_FILE="$tls/ca.pem"
    export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
    export TLS_REDIS_URL="rediss://localhost:$REDIS_TLS_PORT/0" TLS_REDIS_CA="$tls/ca.pem" \
        TLS_REDIS_CERT="$tls/client.pem" TLS_REDIS_KEY="$tls/client.key"
    # REDIS_PORT and APNS_SIM_* stay the scripts' own: apns-worker warns about unknown REDIS_/APNS_ variables.
    export RABBITMQ_PORT RABBITMQ_PROMETHEUS_PORT
    log "services under $SERVICES_DIR: RabbitMQ on $RABBITMQ_PORT (starting), Redis on $REDIS_PORT"
}

services_wait_rabbitmq() {
    (
        services_rabbitmq_env
        # await_startup fails at once while the node has not registered with epmd yet: ask again until it answers.
        deadline=$((SECONDS + 90))
        until rabbitmqctl await_startup >"$SERVICES_DIR/rabbitmq/await.log" 2>&1; do
            [ $SECONDS -lt $deadline ] || exit 1
            sleep 0.5
        done
    ) || { log "RabbitMQ did not start:"; cat "$SERVICES_DIR/rabbitmq/start.log" "$SERVICES_DIR/rabbitmq/await.log" >&2; return 1; }
    for _ in $(seq 50); do
        redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    redis-cli -p "$REDIS_PORT" ping >/dev/null || { log "Redis did not start"; return 1; }
    log "RabbitMQ and Redis are up"
}

# rabbitmqctl against the private node.
services_rabbitmqctl() { ( services_rabbitmq_env; rabbitmqctl "$@" ); }

# apns-sim from BUILD_DIR on a free port; sets APNS_SIM_PORT, APNS_SIM_CA and the worker's APNs URLs.
services_start_sim() {
    APNS_SIM_PORT=$(free_port)
    APNS_SIM_CA="$SERVICES_DIR/apns-sim.pem"
    "$BUILD_DIR/apns-sim" --port "$APNS_SIM_PORT" --write-cert "$APNS_SIM_CA" "$@" >"$SERVICES_DIR/apns-sim.log" 2>&1 &
    APNS_SIM_PID=$!
    for _ in $(seq 100); do
        grep -q "listening" "$SERVICES_DIR/apns-sim.log" 2>/dev/null && break
        sleep 0.05
    done
    grep -q "listening" "$SERVICES_DIR/apns-sim.log" || { log "apns-sim did not start"; cat "$SERVICES_DIR/apns-sim.log" >&2; return 1; }
    export APNS_PRODUCTION_URL="https://127.0.0.1:$APNS_SIM_PORT" APNS_SANDBOX_URL="https://127.0.0.1:$APNS_SIM_PORT"
    export APNS_CA_FILE="$APNS_SIM_CA"
}

services_stop() {
    local status=$?
    [ -n "${SERVICES_DIR:-}" ] || return $status
    # Each step may find its process gone already; none of that may change the exit status.
    set +e
    # Whatever the script left running in the background (a worker, a tail) goes with it, also when it failed.
    local leftover
    for leftover in $(jobs -p); do pkill -TERM -P "$leftover" 2>/dev/null; kill "$leftover" 2>/dev/null; done
    [ -n "${APNS_SIM_PID:-}" ] && kill "$APNS_SIM_PID" 2>/dev/null
    declare -F cluster_stop >/dev/null && cluster_stop
    declare -F sentinel_stop >/dev/null && sentinel_stop
    declare -F redis_cluster_stop >/dev/null && redis_cluster_stop
    [ -f "$SERVICES_DIR/redis/pid" ] && kill "$(cat "$SERVICES_DIR/redis/pid")" 2>/dev/null
    [ -f "$SERVICES_DIR/redis-tls/pid" ] && kill "$(cat "$SERVICES_DIR/redis-tls/pid")" 2>/dev/null
    if [ -n "${RABBITMQ_PORT:-}" ]; then
        services_rabbitmqctl shutdown >/dev/null 2>&1 || true
        # Whatever of the node is left (it may not have finished starting): its command line names our directory.
        pkill -f -- "-home $SERVICES_DIR/rabbitmq-home" 2>/dev/null || true
        # Our own epmd (private port), never the machine's.
        for pid in $(pgrep -x epmd); do
            tr '\0' '\n' 2>/dev/null < "/proc/$pid/environ" | grep -q "^ERL_EPMD_PORT=$RABBITMQ_EPMD$" && kill "$pid"
        done
    fi
    rm -rf "$SERVICES_DIR"
    SERVICES_DIR=""
    return $status
}

# CPU time (clock ticks, user and system) the processes PIDS have used so far; a process gone counts nothing.
cpu_ticks() {
    local pid total=0 fields
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        # Fields after the command's closing parenthesis (a command may hold spaces): utime and stime are the 12th
        # and 13th of them.
        read -r -a fields < <(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
        [ "${#fields[@]}" -gt 12 ] || continue
        total=$((total + fields[11] + fields[12]))
    done
    echo "$total"
}

# The Swift toolchain, where the machine image puts it, when it is not on PATH already.
services_swift_path() {
    command -v swift >/dev/null 2>&1 || export PATH="/opt/swift/usr/bin:$PATH"
    command -v swift >/dev/null 2>&1 || { log "no Swift toolchain: install Swift 6.x first"; return 1; }
}

# 100 users with one or two tokens each (150 tokens), bench-user-0 ... bench-user-99: a fan-out job to all of them is
# 150 notifications. Written as registrations through `apns-worker tokens import` (keys as the configured Redis
# wants them), with $BUILD_DIR/apns-worker.
seed_bench_users() {
    local user
    for user in $(seq 0 99); do
        printf '{"user": "bench-user-%d", "token": "%064x"}\n' "$user" $((user * 2 + 1))
        if [ $((user % 2)) = 0 ]; then
            printf '{"user": "bench-user-%d", "token": "%064x"}\n' "$user" $((user * 2 + 2))
        fi
    done | "$BUILD_DIR/apns-worker" tokens import >/dev/null
}

# Kills every process with a pid file in DIR (the Redis nodes and sentinels of scripts/lib/sentinel.sh and
# scripts/lib/redis-cluster.sh). SIGKILL: their data is thrown away anyway, and a node a test started again may have
# inherited a signal mask that blocks SIGTERM.
kill_pidfiles() {
    [ -n "${1:-}" ] || return 0
    local pidfile
    for pidfile in "$1"/*.pid; do
        [ -f "$pidfile" ] && kill -KILL "$(cat "$pidfile")" 2>/dev/null
    done
    return 0
}

# Waits (up to DEADLINE, in $SECONDS) until CHECK PORT succeeds for every host:port of the comma-separated NODES; logs
# "NAME is up", or NAME's logs under DIR and fails.
wait_for_redis_nodes() {
    local name=$1 nodes=$2 dir=$3 check=$4 deadline=$5 address ready
    while [ $SECONDS -lt "$deadline" ]; do
        ready=1
        for address in ${nodes//,/ }; do "$check" "${address##*:}" || ready=0; done
        [ $ready -eq 1 ] && { log "$name is up"; return 0; }
        sleep 0.2
    done
    log "$name did not come up:"
    tail -n 20 "$dir"/*.log >&2
    return 1
}
