# Runs examples/python and examples/go against the real broker, a worker and apns-sim, as a backend would use them:
# a registration event (applied by `apns-worker cleanup --once`), a job to that user, another user and a dead token
# (its summary read from reply_to), and the dead token's event taken by the cleanup consumer example. A change of the
# contract they use (a job field, an event field, a queue) makes them fail here.
# Source after scripts/lib/services.sh, with the services started and BUILD_DIR holding apns-worker and apns-sim.
# shellcheck shell=bash

examples_run() {
    local dir="$SERVICES_DIR/examples" suffix live other_token dead
    mkdir -p "$dir"
    suffix=$(date +%s%N | tail -c 9)
    live=$(printf 'e1%.0s' $(seq 32)); other_token=$(printf 'e2%.0s' $(seq 32)); dead=$(printf 'ed%.0s' $(seq 32))
    log "examples: building the Go example (Debian's golang and amqp091-go)"
    (cd examples/go && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$dir/gocache" go build -o "$dir/go-example" .)
    (
        export PUSH_JOBS_QUEUE="examples.jobs.$suffix" PUSH_BULK_QUEUE="examples.bulk.$suffix"
        export PUSH_FAILED_QUEUE="examples.failed.$suffix" PUSH_DEAD_TOKENS_QUEUE="examples.dead-tokens.$suffix"
        export PUSH_REGISTRATIONS_QUEUE="examples.registrations.$suffix"
        services_start_sim --unregistered "$dead"
        "$BUILD_DIR/apns-sim" --generate-key "$dir/key.p8" >/dev/null
        export APNS_KEY_FILE="$dir/key.p8" APNS_KEY_ID=EXAMPLEK01 APNS_TEAM_ID=EXAMPLET01 APNS_TOPIC=com.example.app
        export METRICS_PORT=0 LOG_LEVEL=info
        "$BUILD_DIR/apns-worker" run 2>"$dir/worker.log" &
        local worker=$! waited=0
        trap 'kill $worker $APNS_SIM_PID 2>/dev/null' EXIT
        # Ready once it consumes (a poll with a deadline); `cleanup --once` declares the registrations queue.
        until grep -q consuming "$dir/worker.log" 2>/dev/null; do
            waited=$((waited + 1))
            [ "$waited" -lt 300 ] || { log "examples: the worker did not start"; cat "$dir/worker.log" >&2; exit 1; }
            sleep 0.1
        done
        "$BUILD_DIR/apns-worker" cleanup --once >/dev/null 2>&1
        example() {  # example LANGUAGE SUBCOMMAND ARGS...: the same three steps in each language
            local language=$1 step=$2
            shift 2
            if [ "$language" = python ]; then
                case "$step" in
                    register) /usr/bin/python3 examples/python/register_device.py "$@" ;;
                    publish-job) /usr/bin/python3 examples/python/publish_job.py "$@" ;;
                    dead-tokens) /usr/bin/python3 examples/python/dead_token_consumer.py --db "$dir/dead.sqlite" "$@" ;;
                esac
            else
                case "$step" in
                    dead-tokens) "$dir/go-example" dead-tokens -file "$dir/dead.txt" "$@" ;;
                    *) "$dir/go-example" "$step" "$@" ;;
                esac
            fi
        }
        for language in python go; do
            local user="example-$language-$suffix" other="example-$language-other-$suffix"
            "$BUILD_DIR/apns-worker" tokens add "$other" "$other_token" >/dev/null
            example "$language" register --user "$user" --token "$live" --timezone Europe/Paris
            "$BUILD_DIR/apns-worker" cleanup --once >/dev/null 2>&1
            "$BUILD_DIR/apns-worker" tokens list "$user" --json --full-tokens | grep -q "$live" \
                || { log "examples ($language): the registration did not reach the token cache"; exit 1; }
            [ "$(redis-cli -u "$REDIS_URL" GET "apns:timezone:$user")" = Europe/Paris ] \
                || { log "examples ($language): the registration's time zone was not kept"; exit 1; }
            local summary
            summary=$(example "$language" publish-job --user "$user" --user "$other" --token "$dead" --alert "Hello from $language" --timeout 30)
            echo "$summary" | /usr/bin/python3 -c 'import json, sys; s = json.load(sys.stdin); sys.exit(0 if (s["notifications"], s["delivered"], s["dead"]) == (3, 2, 1) else 1)' \
                || { log "examples ($language): unexpected summary $summary"; exit 1; }
            example "$language" dead-tokens --count 1 --timeout 30
            log "examples ($language): registration applied, job summary $summary, dead token stored"
        done
        /usr/bin/python3 -c 'import sqlite3, sys; sys.exit(0 if sqlite3.connect(sys.argv[1]).execute("select count(*) from dead_tokens where token = ?", (sys.argv[2],)).fetchone()[0] == 1 else 1)' "$dir/dead.sqlite" "$dead" \
            || { log "examples (python): the dead token is not in its database"; exit 1; }
        grep -q "^$dead " "$dir/dead.txt" || { log "examples (go): the dead token is not in its file"; exit 1; }
    )
}
