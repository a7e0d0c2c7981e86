import Dispatch
import Foundation
import Redis
import Telemetry
import Testing
import Threads

#if canImport(Glibc)
    import Glibc
#endif

/// A connection that lost a reply stays lost: what the server says late belongs to a command that already failed.
@Suite struct RedisConnectionLossTests {
    /// The server answers PING, then holds its answer to GET until the client has given up on it. Read as the next
    /// command's reply, that late answer would hand one key's value to another: the next command fails at once, and
    /// the server never receives it.
    @Test func aReplyThatCameTooLateIsNeverReadAsTheNextCommands() throws {
        let listener = try ListeningSocket.open(host: "127.0.0.1", port: 0, backlog: 1)
        defer { close(listener.descriptor) }
        let clientGaveUp = DispatchSemaphore(value: 0)
        let lateAnswerSent = DispatchSemaphore(value: 0)
        let serverDone = DispatchSemaphore(value: 0)
        let receivedAfterTheLateAnswer = Locked<[UInt8]?>(nil)
        Thread {
            defer { serverDone.signal() }
            let connection = accept(listener.descriptor, nil, nil)
            guard connection >= 0 else { return }
            defer { close(connection) }
            var timeout = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var received: [UInt8] = []
            func receive(until marker: String) -> Bool {
                var buffer = [UInt8](repeating: 0, count: 4096)
                while !String(decoding: received, as: UTF8.self).contains(marker) {
                    let count = recv(connection, &buffer, buffer.count, 0)
                    guard count > 0 else { return false }
                    received += buffer[..<count]
                }
                return true
            }
            guard receive(until: "PING") else { return }
            _ = send(connection, "+PONG\r\n", 7, Int32(MSG_NOSIGNAL))
            received.removeAll()
            guard receive(until: "first-key") else { return }
            guard clientGaveUp.wait(timeout: .now() + 10) == .success else { return }
            let late = "$11\r\nfirst-value\r\n"
            _ = send(connection, late, late.utf8.count, Int32(MSG_NOSIGNAL))
            lateAnswerSent.signal()
            received.removeAll()
            // Whatever the client writes now, until it closes the connection (or five seconds of silence).
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = recv(connection, &buffer, buffer.count, 0)
                guard count > 0 else { break }
                received += buffer[..<count]
            }
            receivedAfterTheLateAnswer.withLock { $0 = received }
        }.start()

        var connection: RedisConnection? = try RedisConnection(
            url: RedisURL(host: "127.0.0.1", port: listener.port), timeout: 0.3)
        let first = #expect(throws: RedisError.self) { try connection!.command(["GET", "first-key"]) }
        #expect(first?.kind == .connectionLost)
        clientGaveUp.signal()
        // On loopback the late answer is in the client's socket once the server's send returns.
        #expect(lateAnswerSent.wait(timeout: .now() + 10) == .success)
        let second = Result { () throws(RedisError) in try connection!.command(["GET", "second-key"]) }
        guard case .failure(let error) = second else {
            Issue.record("the late answer was read as the second command's reply: \(second)")
            return
        }
        #expect(error.kind == .connectionLost)
        connection = nil
        #expect(serverDone.wait(timeout: .now() + 10) == .success)
        #expect(receivedAfterTheLateAnswer.withLock { $0 } == [], "nothing written after the loss")
    }

    /// A node that answers READONLY (it became a replica) to the first command of a pipeline: the call fails, and the
    /// pipeline's other replies, still unread, are never taken for a later command's.
    @Test func aReplicasAnswerEndsTheConnection() throws {
        let listener = try ListeningSocket.open(host: "127.0.0.1", port: 0, backlog: 1)
        defer { close(listener.descriptor) }
        let clientDone = DispatchSemaphore(value: 0)
        Thread {
            let connection = accept(listener.descriptor, nil, nil)
            guard connection >= 0 else { return }
            defer { close(connection) }
            var buffer = [UInt8](repeating: 0, count: 4096)
            var received = ""
            for (marker, answer) in [("PING", "+PONG\r\n"), ("second", "-READONLY replica\r\n$5\r\nvalue\r\n")] {
                while !received.contains(marker) {
                    let count = recv(connection, &buffer, buffer.count, 0)
                    guard count > 0 else { return }
                    received += String(decoding: buffer[..<count], as: UTF8.self)
                }
                _ = send(connection, answer, answer.utf8.count, Int32(MSG_NOSIGNAL))
            }
            _ = clientDone.wait(timeout: .now() + 10)
        }.start()
        let connection = try RedisConnection(url: RedisURL(host: "127.0.0.1", port: listener.port), timeout: 5)
        let failed = #expect(throws: RedisError.self) {
            try connection.pipeline([["GET", "first"], ["GET", "second"]])
        }
        #expect(failed?.kind == .connectionLost)
        let next = Result { () throws(RedisError) in try connection.command(["GET", "third"]) }
        clientDone.signal()
        guard case .failure(let error) = next else {
            Issue.record("the pipeline's unread reply was read as the next command's: \(next)")
            return
        }
        #expect(error.kind == .connectionLost)
    }
}
