/// A value type's members kept in one shared box, copied on write: for a value the pipeline passes through several
/// arrays, filters and hand-overs (a job), where a copy then costs one reference count instead of one per string and
/// array member.
struct SharedMembers<Members: Sendable>: @unchecked Sendable {
    // Invariant: `box.members` changes only in `change`, after the box was made unique, so a box shared between
    // threads is only read.
    private final class Box {
        var members: Members

        init(_ members: Members) { self.members = members }
    }

    private var box: Box

    init(_ members: Members) { box = Box(members) }

    var members: Members {
        _read { yield box.members }
    }

    /// Changes the members in place when this value alone holds the box, in a copy of it otherwise.
    mutating func change(_ apply: (inout Members) -> Void) {
        if !isKnownUniquelyReferenced(&box) { box = Box(box.members) }
        apply(&box.members)
    }

    func isSameBox(as other: SharedMembers) -> Bool { box === other.box }
}
