/// Good and bad jobs: the rows of the decoder's tests (`PushJobTests`, `LiveActivityJobTests`), and the corpus on
/// which `schema/job.schema.json` and the decoder must agree (`JobSchemaTests`).
enum JobCorpus {
    static let token = String(repeating: "ab", count: 32)

    /// Jobs a worker refuses, with words of the reason it gives.
    static let refused: [(String, String)] = [
        ("{", "body is not JSON"),
        ("[1]", "body must be a JSON object, got an array"),
        (#"{"payload": {}}"#, "no targets"),
        (#"{"users": [], "tokens": [], "payload": {}}"#, "no targets"),
        (#"{"users": "u1", "payload": {}}"#, "\"users\" must be an array of strings, got a string"),
        (#"{"users": [1], "payload": {}}"#, "\"users[0]\" must be a string, got a number"),
        (#"{"tokens": ["nothex"], "payload": {}}"#, "tokens[0]"),
        (#"{"users": ["u"], "push_type": "smoke", "payload": {}}"#, "unknown push_type \"smoke\""),
        (#"{"users": ["u"], "priority": 7, "payload": {}}"#, "priority 7"),
        (#"{"users": ["u"], "priority": "10", "payload": {}}"#, "\"priority\" must be a whole number, got a string"),
        (
            #"{"users": ["u"], "push_type": "background", "priority": 10, "payload": {}}"#,
            "background pushes must use priority 5 or 1"
        ),
        (#"{"users": ["u"], "environment": "staging", "payload": {}}"#, "environment \"staging\""),
        (#"{"users": ["u"], "expiration": -1, "payload": {}}"#, "expiration -1"),
        (#"{"users": ["u"], "topic": "t", "deadline": -5, "payload": {}}"#, "deadline -5 must be UNIX seconds"),
        (#"{"users": ["u"], "topic": "t", "deadline": 1798761600000, "payload": {}}"#, "not milliseconds"),
        (
            #"{"users": ["u"], "topic": "t", "deadline": "tomorrow", "payload": {}}"#,
            "\"deadline\" must be a whole number, got a string"
        ),
        (
            #"{"users": ["u"], "topic": "t", "deadline": 1798761600.5, "payload": {}}"#,
            "\"deadline\" must be a whole number"
        ),
        (#"{"users": ["u"], "topic": "t", "send_at": -1, "payload": {}}"#, "send_at -1 must be UNIX seconds"),
        (#"{"users": ["u"], "topic": "t", "send_at": 1798761600000, "payload": {}}"#, "not milliseconds"),
        (
            #"{"users": ["u"], "topic": "t", "send_at": "18:00", "payload": {}}"#,
            "\"send_at\" must be a whole number, got a string"
        ),
        (
            #"{"users": ["u"], "topic": "t", "local_window": {"start": "9:00", "end": "21:00"}, "payload": {}}"#,
            "local_window.start"
        ),
        (
            #"{"users": ["u"], "topic": "t", "local_window": {"start": "09:00"}, "payload": {}}"#,
            "missing field \"local_window.end\""
        ),
        (
            #"{"users": ["u"], "topic": "t", "local_window": {"start": "09:00", "end": "21:00", "tz": "UTC"}, "payload": {}}"#,
            "unknown member \"tz\""
        ),
        (
            #"{"users": ["u"], "topic": "t", "default_timezone": "Europe/Paris", "payload": {}}"#,
            "goes with a \"local_window\""
        ),
        (
            #"{"users": ["u"], "topic": "t", "local_window": {"start": "09:00", "end": "21:00"}, "default_timezone": "Europe/../Paris", "payload": {}}"#,
            "not an IANA time zone name"
        ),
        (
            #"{"topic": "t", "activity": "m1", "local_window": {"start": "09:00", "end": "21:00"}, "payload": {}}"#,
            "give no \"local_window\""
        ),
        (#"{"users": ["u"], "payload": {}}"#, "no topic"),
        (#"{"users": ["u"], "topic": "t"}"#, "missing field \"payload\""),
        (#"{"users": ["u"], "topic": "t", "payload": "hi"}"#, "\"payload\" must be an object, got a string"),
        // A string or a number is not a yes: either would have sent the real campaign instead of silent pushes.
        (
            #"{"users": ["u"], "topic": "t", "prevalidate": "true", "payload": {}}"#,
            "\"prevalidate\" must be true or false, got a string"
        ),
        (
            #"{"users": ["u"], "topic": "t", "prevalidate": 1, "payload": {}}"#,
            "\"prevalidate\" must be true or false, got a number"
        ),
        // Readers disagree about a name given twice (the first or the last value): refused, named.
        (#"{"tokens": ["aaaa"], "tokens": ["bbbb"], "topic": "t", "payload": {}}"#, "duplicate key \"tokens\""),
        (
            #"{"users": ["u"], "topic": "t", "payload": {"aps": {"alert": "a", "alert": "b"}}}"#,
            "duplicate key \"alert\""
        ),
        // Values sent as HTTP/2 headers.
        (
            #"{"users": ["u"], "topic": "com.example\u0000app", "payload": {}}"#,
            "\"topic\" holds a byte that is not an ASCII letter"
        ),
        (
            #"{"users": ["u"], "topic": "com.example.app\r\nx-evil: 1", "payload": {}}"#,
            "\"topic\" holds a byte that is not an ASCII letter"
        ),
        (#"{"users": ["u"], "topic": "com.example app", "payload": {}}"#, #""topic" holds " ""#),
        (#"{"users": ["u"], "topic": "com.example/../other", "payload": {}}"#, #""topic" holds "/""#),
        (#"{"users": ["u"], "topic": "com.example?x", "payload": {}}"#, #""topic" holds "?""#),
        (##"{"users": ["u"], "topic": "com.example#x", "payload": {}}"##, ##""topic" holds "#""##),
        (#"{"users": ["u"], "topic": "com.example%2Fother", "payload": {}}"#, #""topic" holds "%""#),
        (#"{"users": ["u"], "topic": "com..example", "payload": {}}"#, #""topic" has an empty part"#),
        (
            #"{"users": ["u"], "topic": "t", "collapse_id": "a\tb", "payload": {}}"#,
            "\"collapse_id\" holds control character 0x9"
        ),
        (
            #"{"users": ["u"], "topic": "t", "collapse_id": " a", "payload": {}}"#,
            "\"collapse_id\" starts or ends with a space"
        ),
        (
            #"{"users": ["u"], "topic": "com.example.app\n", "payload": {}}"#,
            "\"topic\" holds a byte that is not an ASCII letter"
        ),
        (
            #"{"topic": "t", "channel_id": "abc", "live_activity": {"event": "update", "timestamp": 1, "content_state": {}}}"#,
            "not base64"
        ),
        // An activity id names a Redis key: braces would move its cluster hash tag, "*" and spaces mean things to SCAN.
        (#"{"topic": "t", "activity": "a b}{*", "payload": {}}"#, "\"activity\" must be 1 to 256 ASCII letters"),
        (#"{"topic": "t", "activity": "match{42}", "payload": {}}"#, "\"activity\" must be 1 to 256 ASCII letters"),
        (#"{"topic": "t", "activity": "", "payload": {}}"#, "\"activity\" must be 1 to 256 ASCII letters"),
        // A prevalidation job sends a silent push, and its campaign's payload is still checked.
        (#"{"users": ["u"], "topic": "t", "prevalidate": true, "payload": "hi"}"#, "\"payload\" must be an object"),
        (
            #"{"users": ["u"], "topic": "t", "prevalidate": true, "payload": {}, "live_activity": {"event": "update", "timestamp": 1, "content_state": {}}}"#,
            "not both"
        )
    ]

    /// `live_activity` objects a worker refuses (in a job to one token of com.example.app), with words of the reason.
    static let refusedLiveActivities: [(String, String)] = [
        (#"{"event": "start", "timestamp": 1, "content_state": {}, "alert": {}}"#, "a start needs \"attributes_type\""),
        (
            #"{"event": "start", "timestamp": 1, "content_state": {}, "attributes_type": "A", "alert": {}}"#,
            "a start needs \"attributes\""
        ),
        (
            #"{"event": "start", "timestamp": 1, "content_state": {}, "attributes_type": "A", "attributes": {}}"#,
            "a start needs \"alert\""
        ),
        (#"{"event": "update", "timestamp": 1}"#, "an update needs \"content_state\""),
        (#"{"event": "end", "timestamp": 1}"#, "an end needs \"content_state\""),
        (
            #"{"event": "update", "timestamp": 1, "content_state": {}, "stale_date": 1796184000000}"#,
            "looks like milliseconds"
        ),
        (
            #"{"event": "update", "timestamp": 1, "content_state": {}, "attributes": {}}"#,
            "\"attributes\" belongs to a start only"
        ),
        (#"{"event": "update", "timestamp": 99999999999, "content_state": {}}"#, "s in the future"),
        (#"{"event": "update", "timestamp": 1796184000000, "content_state": {}}"#, "looks like milliseconds"),
        (#"{"event": "update", "content_state": {}}"#, "\"timestamp\" is required"),
        (#"{"event": "pause", "timestamp": 1}"#, "not start, update or end"),
        (#"{"event": "update", "timestamp": 1, "contentState": {}}"#, "unknown field \"contentState\""),
        (
            #"{"event": "update", "timestamp": 1, "content_state": "x"}"#,
            "\"live_activity.content_state\" must be an object"
        ),
        (#""start""#, "\"live_activity\" must be an object")
    ]

    /// A `live_activity` object in a job to one token of com.example.app.
    static func liveActivityJob(_ liveActivity: String, extra: String = "") -> String {
        #"{"topic": "com.example.app", "tokens": ["\#(token)"]\#(extra), "live_activity": \#(liveActivity)}"#
    }

    /// Jobs a worker accepts (with APNS_TOPIC set): each kind the contract describes.
    static let accepted: [String] = [
        #"{"users": ["u1"], "payload": {"aps": {"alert": "Hello"}}}"#,
        #"{"id": "job-42", "topic": "com.example.app", "users": ["u1", "u2"], "tokens": ["\#(token)"], "environment": "sandbox", "push_type": "alert", "priority": 10, "expiration": 0, "collapse_id": "order-7", "deadline": 1798761600, "payload": {"aps": {"alert": "Hello"}, "n": 1.50}}"#,
        #"{"users": ["u1"], "tokens": [], "push_type": "background", "priority": 5, "payload": {"aps": {"content-available": 1}}}"#,
        #"{"users": ["u1"], "push_type": "voip", "payload": {}}"#,
        // A send_at that has passed: sent now.
        #"{"users": ["u1"], "send_at": 1700000000, "deadline": 1700000060, "payload": {}}"#,
        #"{"users": ["u1"], "local_window": {"start": "21:00", "end": "08:30"}, "default_timezone": "America/Argentina/Buenos_Aires", "payload": {}}"#,
        #"{"users": ["u1"], "local_window": null, "default_timezone": null, "payload": {}}"#,
        #"{"tokens": ["ABCDEF0123"], "topic": "com.example.app", "collapse_id": "a b", "payload": {}}"#,
        #"{"users": ["u1"], "prevalidate": true}"#,
        #"{"users": ["u1"], "prevalidate": false, "id": null, "topic": null, "priority": null, "payload": {}}"#,
        #"{"users": ["u1"], "payload": {}, "sent_by": "billing-service"}"#,
        #"{"activity": "match-42", "priority": 5, "live_activity": {"event": "update", "timestamp": 1796184120, "content_state": {"score": "1-0"}}}"#,
        #"{"activity": "match-42", "live_activity": {"event": "end", "timestamp": 1796190000, "content_state": {"score": "2-1"}, "dismissal_date": 1796190600}}"#,
        #"{"topic": "com.example.scores", "channel_id": "AZTvW5MSSFuwBMDpdBKaJA==", "live_activity": {"event": "update", "timestamp": 1796184060, "content_state": {"score": "1-0"}, "relevance_score": 100}}"#,
        #"{"topic": "com.example.scores", "channel_id": "AZTvW5MSSFuwBMDpdBKaJA==", "push_type": "liveactivity", "payload": {"aps": {"event": "update"}}}"#,
        liveActivityJob(
            #"{"event": "start", "timestamp": 1796184000, "content_state": {"score": "0-0"}, "attributes_type": "MatchAttributes", "attributes": {"match": "Lyon - Nantes"}, "alert": {"title": "Kick-off"}, "input_push_channel": "AZTvW5MSSFuwBMDpdBKaJA==", "input_push_token": true}"#
        ),
        liveActivityJob(
            #"{"event": "update", "timestamp": 1796184000, "content_state": {}, "stale_date": 1796187600, "relevance_score": 50.5, "alert": {"title": "Goal"}}"#
        )
    ]

    /// Refused by the worker, valid against the schema: what JSON Schema cannot express (README lists them).
    static let beyondTheSchema: [(body: String, why: String)] = [
        (#"{"tokens": ["aaaa"], "tokens": ["bbbb"], "topic": "t", "payload": {}}"#, "a key given twice"),
        (#"{"users": ["u"], "topic": "t", "payload": {"aps": {"alert": "a", "alert": "b"}}}"#, "a key given twice"),
        (
            liveActivityJob(#"{"event": "update", "timestamp": 99999999999, "content_state": {}}"#),
            "a Live Activity timestamp ahead of the worker's clock"
        ),
        (
            #"{"users": ["u"], "payload": {"aps": {"alert": "\#(String(repeating: "x", count: 4100))"}}}"#,
            "the payload's size in bytes, per push type"
        ),
        (
            #"{"users": ["u"], "collapse_id": "\#(String(repeating: "é", count: 40))", "payload": {}}"#,
            "lengths in bytes (collapse_id, users, activity): the schema counts characters"
        ),
        (
            #"{"users": ["u"], "payload": {}, "send_at": 99999999999}"#,
            "a send_at more than 7 days ahead of the worker's clock"
        ),
        (
            #"{"users": ["u"], "payload": {}, "send_at": 1700000100, "deadline": 1700000000}"#,
            "a deadline before send_at"
        ),
        (
            #"{"users": ["u"], "payload": {}, "send_at": 1700000100, "deadline": 1700000100}"#,
            "a deadline at send_at: nothing is sent once the deadline has come"
        ),
        (
            #"{"users": ["u"], "payload": {}, "local_window": {"start": "09:00", "end": "09:00"}}"#,
            "a local_window of no minute (start and end equal)"
        ),
        (
            #"{"users": ["u"], "payload": {}, "local_window": {"start": "09:00", "end": "21:00"}, "default_timezone": "Mars/Olympus"}"#,
            "a time zone the system's database does not have"
        ),
        (
            #"{"users": ["u"], "payload": {}, "priority": 10.0}"#,
            "whole numbers written as such: JSON Schema's integer takes 10.0"
        ),
        (
            #"{"users": ["u"], "payload": {}, "expiration": 1e3}"#,
            "whole numbers written as such: JSON Schema's integer takes 1e3"
        )
    ]
}
