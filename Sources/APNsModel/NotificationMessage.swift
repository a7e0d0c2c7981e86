/// What the notifications made from one message have in common (every field but the device token and its
/// environment), in one box that they share and copy on write (`APNsNotification`): a notification is made, put in
/// arrays and copied on its way to its request, and each copy then counts two references (its token, the box), not
/// one per string and array.
///
/// Open so that a job can keep its own members in a box of this kind, beside its notifications' fields
/// (`PushJobStorage`): its notifications then share the job's box rather than one made for them, which is one
/// allocation and its freeing fewer for every job.
open class NotificationMessage: @unchecked Sendable {
    // Invariant: `fields` changes only in a box that its one holder made unique first (`APNsNotification` and the
    // job's own copy on write), so a box shared between threads is only read. Visible to the package (for inlining
    // into other modules, and for the job's box), which keeps to that.
    @usableFromInline package final var fields: APNsNotification.Message

    @inlinable package init(fields: APNsNotification.Message) { self.fields = fields }
}
