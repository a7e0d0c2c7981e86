# `--markdown FILE` for scripts/bench and scripts/profile: the run's tables and summary lines written to FILE as
# Markdown, under a line that says when, on which commit and machine, and with which command they were measured.
# Source it, call `markdown_capture FILE "COMMAND"` before the run prints anything, and `markdown_write` at its end.
# shellcheck shell=bash

markdown_capture() {
    MARKDOWN_FILE=$1
    MARKDOWN_COMMAND=$2
    # The commit the run builds, taken now: one made while it runs is not what it measured.
    MARKDOWN_COMMIT=$(git rev-parse --short HEAD)
    # And the cores, before a run narrows its own (scripts/bench's split).
    MARKDOWN_CORES=$(nproc)
    git diff --quiet HEAD -- Sources Package.swift scripts || MARKDOWN_COMMIT+=" (with uncommitted changes)"
    MARKDOWN_LOG=$(mktemp /tmp/apns-worker-markdown.XXXXXX)
    exec 3>&1
    exec > >(tee "$MARKDOWN_LOG")
    MARKDOWN_TEE=$!
}

markdown_write() {
    [ -n "${MARKDOWN_FILE:-}" ] || return 0
    # Everything printed so far reaches the log once tee has read it to the end: stdout goes back, tee ends.
    exec 1>&3 3>&-
    wait "$MARKDOWN_TEE" 2>/dev/null || true
    {
        echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on commit $MARKDOWN_COMMIT, $MARKDOWN_CORES cores," \
             "$(free -g | awk '/^Mem:/ { print $2 }') GB, with \`$MARKDOWN_COMMAND\`:"
        echo
        awk '/^\|/ { print; table = 1; next }
             table { print ""; table = 0 }
             /^summary: / { sub(/^summary: /, "- "); print }' "$MARKDOWN_LOG"
    } > "$MARKDOWN_FILE"
    rm -f "$MARKDOWN_LOG"
    log "wrote $MARKDOWN_FILE"
}
