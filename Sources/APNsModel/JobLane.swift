/// Which of the two lanes work travels in. Urgent jobs (PUSH_JOBS_QUEUE) always go first; bulk jobs
/// (PUSH_BULK_QUEUE) take what urgent work leaves: the in-flight window, the rate limit, the worker's attention. The
/// APNs client keeps connections and a thread per lane, so that an urgent request never waits behind bulk requests
/// for a stream, in a connection's send buffer or in the order a server reads one connection.
public enum JobLane: String, Sendable, Hashable, CaseIterable {
    case urgent, bulk
}
