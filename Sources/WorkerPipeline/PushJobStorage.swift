import APNsModel

/// A job's box: what its notifications are sent with (`fields`, which they share: `NotificationMessage`), and the
/// rest of the job (`members`). Copied on write by `PushJob`.
final class PushJobStorage: NotificationMessage, @unchecked Sendable {
    var members: PushJob.Members

    init(fields: APNsNotification.Message, members: PushJob.Members) {
        self.members = members
        super.init(fields: fields)
    }
}
