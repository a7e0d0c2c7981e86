/// Apple's rules for a push request, written for the simulator from Apple's documentation ("Sending notification
/// requests to APNs", "Handling notification responses from APNs") and kept apart from the client's own checks
/// (`APNsNotification.validate`): the simulator must catch a rule the client gets wrong, not share it.
/// `SimulatorValidationTests` holds the table of verdicts these must give.
enum AppleRules {
    /// `apns-push-type` values and the suffix each requires at the end of `apns-topic` ("" for none).
    static let topicSuffixes: [String: String] = [
        "alert": "", "background": "", "mdm": "",
        "voip": ".voip", "complication": ".complication", "fileprovider": ".pushkit.fileprovider",
        "liveactivity": ".push-type.liveactivity", "location": ".location-query", "pushtotalk": ".voip-ptt",
        "widgets": ".push-type.widgets", "controls": ".push-type.controls"
    ]

    /// `apns-priority`: 10 immediately, 5 power-aware, 1 lowest.
    static let priorities: Set<String> = ["10", "5", "1"]

    /// Payload bytes at most: 4096, and 5120 for VoIP.
    static func payloadLimit(pushType: String) -> Int { pushType == "voip" ? 5120 : 4096 }

    /// `apns-collapse-id` bytes at most.
    static let collapseIDLimit = 64

    /// A device token: hex digits, a whole number of bytes. (Apple fixes no length.)
    static func isDeviceToken(_ token: String) -> Bool {
        // Over the string's own UTF-8 in place, with no array made of it (the simulator checks every push's token).
        var token = token
        return token.withUTF8 { bytes in
            !bytes.isEmpty && bytes.count % 2 == 0
                && bytes.allSatisfy { byte in
                    (byte >= 48 && byte <= 57) || (byte >= 97 && byte <= 102) || (byte >= 65 && byte <= 70)
                }
        }
    }

    /// `apns-id`: a UUID in its canonical lowercase form, 8-4-4-4-12.
    static func isCanonicalUUID(_ text: String) -> Bool {
        let groups = text.split(separator: "-", omittingEmptySubsequences: false)
        return groups.map(\.count) == [8, 4, 4, 4, 12]
            && groups.allSatisfy { $0.utf8.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) } }
    }
}
