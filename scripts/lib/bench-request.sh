# The push every benchmark sends, so that h2load and the worker are measured on the same bytes: the payload of
# `apns-bench fill` (a realistic alert), for h2load's -d.

# Writes the payload to FILE.
bench_payload() {
    printf '%s' '{"aps":{"alert":{"title":"Benchmark","body":"A notification of a realistic size"},"badge":1}}' > "$1"
}
