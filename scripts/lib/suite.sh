# The whole test suite in its phases, against the services scripts/test starts: shared by scripts/test and
# scripts/sanitize, so that a sanitizer run covers what CI covers (the cluster, Sentinel and Redis Cluster suites
# included). Source after scripts/lib/services.sh; suite_start_services, build, suite_wait_services, then suite_run.
# shellcheck shell=bash
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
source "$(dirname "${BASH_SOURCE[0]}")/sentinel.sh"
source "$(dirname "${BASH_SOURCE[0]}")/redis-cluster.sh"

# Starts every service the suite uses; they boot while Swift builds.
suite_start_services() {
    services_start                      # RabbitMQ boots (~5-10 s)
    cluster_start                       # the three-node cluster for ClusterTests (~30 s)
    sentinel_start                      # Redis with Sentinel for SentinelTests
    redis_cluster_start                 # a three-master Redis Cluster for RedisClusterTests
}

suite_wait_services() {
    services_wait_rabbitmq
    cluster_wait
    sentinel_wait
    redis_cluster_wait
}

# Runs the suite: `suite_run [swift test options]` (e.g. --sanitize=thread --scratch-path DIR). BrokerRestartTests
# restarts the shared broker, ClusterTests stops the cluster's nodes, SentinelTests kills the Redis master:
# everything else first, in parallel, then each alone.
suite_run() {
    swift test --skip-build "$@" --skip BrokerRestartTests --skip 'IntegrationTests\.ClusterTests' --skip SentinelTests
    log "restarting the broker under a running worker (BrokerRestartTests, alone)"
    swift test --skip-build "$@" --filter BrokerRestartTests
    log "stopping cluster nodes under a worker and enqueue (ClusterTests, alone)"
    swift test --skip-build "$@" --filter 'IntegrationTests\.ClusterTests'
    log "killing the Redis master under a worker (SentinelTests, alone)"
    swift test --skip-build "$@" --filter SentinelTests
}
