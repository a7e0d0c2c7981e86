/// A value type's members kept in one shared box, copied on write: for a value the pipeline passes through several
/// arrays, filters and hand-overs (a job, a notification), where a copy then costs one reference count instead of one
/// per string and array member.
@usableFromInline
package struct SharedMembers<Members: Sendable>: @unchecked Sendable {
    // Invariant: `box.members` changes only in `change`, after the box was made unique, so a box shared between
    // threads is only read. `box` is visible to the module (for inlining into other modules), which keeps to that.
    @usableFromInline
    final class Box {
        @usableFromInline var members: Members

        @inlinable init(_ members: Members) { self.members = members }
    }

    @usableFromInline var box: Box

    @inlinable package init(_ members: Members) { box = Box(members) }

    @inlinable package var members: Members {
        _read { yield box.members }
    }

    /// Changes the members in place when this value alone holds the box, in a copy of it otherwise.
    @inlinable package mutating func change(_ apply: (inout Members) -> Void) {
        if !isKnownUniquelyReferenced(&box) { box = Box(box.members) }
        apply(&box.members)
    }

    @inlinable package func isSameBox(as other: SharedMembers) -> Bool { box === other.box }
}
