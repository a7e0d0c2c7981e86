internal import CNghttp2
import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// Bytes in and out: TLS records read and handed to nghttp2, frames written in batches, closing.
extension HTTP2Connection {
    /// Plaintext handed to nghttp2 per turn of the loop, at most: a connection with a full socket then yields to the
    /// loop's other connections after a few records instead of draining it all, so that a quiet connection (an
    /// urgent request, its answer) never waits behind thousands of frames of a busy one.
    static let readBytesPerTurn = 64 * 1024
    /// Decrypts what has arrived, record after record into one buffer, and hands the buffer to nghttp2 whenever it
    /// cannot take another full record: a burst of small answers, one record each, costs one nghttp2 call.
    func readAvailable() {
        guard session != nil else { return }
        var filled = 0
        var readThisTurn = 0
        var more = true
        reading: while state == .open && more {
            if readThisTurn >= Self.readBytesPerTurn {
                if !readingContinues {
                    readingContinues = true
                    let continuation = LoopThreadReference(connection: self)
                    loop.execute {
                        continuation.connection.readingContinues = false
                        continuation.connection.readAvailable()
                    }
                }
                break reading
            }
            switch tls.read(into: UnsafeMutableRawBufferPointer(rebasing: readBuffer[filled...])) {
            case .done(let count):
                filled += count
                readThisTurn += count
                if Self.readBufferSize - filled >= Self.largestRecord { continue reading }
            case .wantRead:
                more = false
            case .wantWrite:
                wantsWrite = true
                more = false
            case .closed:
                guard deliver(filled) else { return }
                close(reason: goAwayReceived != nil ? "closed by the peer after GOAWAY" : "closed by the peer")
                return
            case .failed(let message):
                guard deliver(filled) else { return }
                close(reason: message)
                return
            }
            guard deliver(filled) else { return }
            filled = 0
        }
        if filled > 0 && !deliver(filled) { return }
        flush()
    }

    /// The plaintext of a TLS record, at most (RFC 8446 section 5.1).
    static let largestRecord = 16 * 1024

    /// Hands `count` bytes of the read buffer to nghttp2; false once the connection closed over them.
    func deliver(_ count: Int) -> Bool {
        guard count > 0, let session, state == .open else { return state == .open }
        processingInput = true
        let consumed = nghttp2_session_mem_recv(
            session, readBuffer.baseAddress!.assumingMemoryBound(to: UInt8.self), count)
        processingInput = false
        if consumed < 0 {
            close(reason: "HTTP/2 protocol error: \(String(cString: nghttp2_strerror(Int32(consumed))))")
            return false
        }
        if let reason = closeRequested {
            close(reason: reason)
            return false
        }
        return true
    }

    func flush() {
        guard state == .open, let session else { return }
        while true {
            while outboundSent < outbound.count {
                let result = outbound.withUnsafeBytes { bytes in
                    tls.write(UnsafeRawBufferPointer(rebasing: bytes[outboundSent...]))
                }
                switch result {
                case .done(let count):
                    outboundSent += count
                case .wantWrite:
                    wantsWrite = true
                    return
                case .wantRead:
                    wantsWrite = false
                    return
                case .closed:
                    close(reason: "closed by the peer")
                    return
                case .failed(let message):
                    close(reason: message)
                    return
                }
            }
            outbound.removeAll(keepingCapacity: true)
            outboundSent = 0
            // Before nghttp2 takes the next queued HEADERS: those past their send-by time are dropped, not sent.
            if earliestQueuedSendBy != .max { dropUnsentRequests(pastSendByAt: EventLoop.now()) }
            while outbound.count < Self.writeBatchSize {
                var data: UnsafePointer<UInt8>?
                let count = nghttp2_session_mem_send(session, &data)
                if count < 0 {
                    close(reason: "HTTP/2 error: \(String(cString: nghttp2_strerror(Int32(count))))")
                    return
                }
                guard count > 0, let data else { break }
                outbound.append(contentsOf: UnsafeBufferPointer(start: data, count: count))
            }
            if let reason = closeRequested {
                close(reason: reason)
                return
            }
            if outbound.isEmpty { break }
        }
        // Records the socket did not take yet leave when it is writable again.
        switch tls.sendPendingOutput() {
        case .wantWrite:
            wantsWrite = true
            return
        case .failed(let message):
            close(reason: message)
            return
        default:
            wantsWrite = false
        }
        if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            close(reason: goAwayReceived != nil || goAwaySent ? "GOAWAY completed" : "session ended")
        }
    }

    /// Ends the connection and answers every stream still open with `connectionLost`.
    func close(reason: String) {
        guard state != .closed else { return }
        let wasRegistered = state != .closed
        state = .closed
        if wasRegistered { loop.deregister(self) }
        tls.shutdown()
        Glibc.close(fileDescriptor)
        let lost = openStreams
        for stream in lost { remove(stream) }
        for stream in lost {
            let streamID = stream.id
            // Only a request the server may have seen counts as lost; one above a GOAWAY's last-stream-id, or
            // never written, certainly was not processed.
            if stream.malformed {
                answer(stream, .failure(.reset(code: NGHTTP2_PROTOCOL_ERROR.rawValue)))
            } else if !stream.headersSent {
                answer(stream, .failure(.notSent(reason)))
            } else if let goAway = goAwayReceived, streamID > goAway.lastStreamID {
                answer(stream, .failure(.refused))
            } else {
                answer(stream, .failure(.connectionLost(reason)))
            }
        }
        onClose?(self, reason)
        onOpen = nil
        onClose = nil
        onRemoteSettings = nil
        onGoAway = nil
        onPingAcknowledged = nil
        onResponse = nil
    }
}
